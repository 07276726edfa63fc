"""The site executor: NVFlare's in-process Client API running the *installed* fedseg site entry.

NVFlare's ``ClientAPIExecutor`` looks for its ``task_script_path`` in the job's ``app/custom/`` folder, so a job
built that way carries Python code — "bring your own code" (BYOC), which a production deployment refuses
(``authorization.json``: right ``byoc`` = ``none``). This executor instead points the same in-process runner at
``fedseg/fl/site_script.py`` of the fedseg package installed at the site, resolved on the site's machine when
the job starts. The job folder then holds configuration only (``meta.json`` + ``app/config/*.json``): nothing
executable travels from the server to a hospital, and the code that runs is the version its IT installed.
"""

from __future__ import annotations

from pathlib import Path

from nvflare.app_common.executors.client_api_executor import ClientAPIExecutor
from nvflare.client.config import ExchangeFormat, TransferType

#: the site entry script inside the installed package (``python -m fedseg.fl.client`` does the same)
INSTALLED_SITE_SCRIPT = Path(__file__).resolve().parent / "site_script.py"


class FedSegSiteExecutor(ClientAPIExecutor):
    """In-process Client API executor whose training script is the installed ``fedseg.fl.site_script``.

    Args:
        script_args: command-line arguments for the site script (``fedseg.fl.client.parse_args``),
            e.g. ``--site_datalists sites.json``.
    """

    def __init__(self, script_args: str = ""):
        if not INSTALLED_SITE_SCRIPT.is_file():
            raise FileNotFoundError(
                f"the installed fedseg package has no site entry {INSTALLED_SITE_SCRIPT}; reinstall fedseg at this site"
            )
        super().__init__(
            execution_mode="in_process",
            # an absolute path: NVFlare's TaskScriptRunner uses it as is instead of searching app/custom/
            task_script_path=str(INSTALLED_SITE_SCRIPT),
            task_script_args=script_args,
            params_exchange_format=ExchangeFormat.PYTORCH,
            server_expected_format=ExchangeFormat.PYTORCH,
            params_transfer_type=TransferType.FULL,
        )
        self.script_args = script_args  # recipe export records constructor args stored as self.<name>
