from fedseg.cli import main

main()
