"""Site entry run in-process by ``fedseg.fl.site_executor.FedSegSiteExecutor`` from the installed package.

It is never copied into a job (a job carrying code is BYOC, refused by a production deployment).
"""

from fedseg.fl.client import main

if __name__ == "__main__":
    main()
