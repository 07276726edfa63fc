"""The in-process server workflow for tests (``fedseg.bench.inprocess``)."""

from fedseg.bench.inprocess import InProcessController, controller_args, run_in_process  # noqa: F401
