"""Entry point NVFlare's ScriptRunner copies into each job (app/custom/site_script.py)."""

from fedseg.fl.client import main

if __name__ == "__main__":
    main()
