"""Site entry for a site that trains as N ranks: ``torchrun --nproc_per_node=N -m fedseg.fl.site_ranks ARGS``.

Launched by NVFlare (``fedseg.fl.site_executor.FedSegRanksExecutor``, recipe option
``site_executor="client_api_torchrun"``) from the installed package; ARGS are the site options of
``fedseg.fl.client.parse_args``. Rank 0 runs the Client API site loop (only rank 0 opens an NVFlare session, as
NVFlare's ``flare.init()`` does for a global ``RANK`` other than 0) and answers every task; ranks 1..N-1 build the
same engines and join the training epochs (``fedseg.engine.distributed``). When NVFlare ends the job, rank 0 tells
the others to stop and every rank leaves the process group.
"""

from __future__ import annotations

import logging

from fedseg.engine.distributed import STOP, RankGroup, RanksOutOfStep, follow
from fedseg.engine.factory import build_engine
from fedseg.fl.client import parse_args, serve_client_api, set_site_threads


def main(argv=None) -> None:
    # NVFlare keeps the launched trainer's output in the site's log: each rank says where it runs
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    args = parse_args(argv)
    set_site_threads()
    ranks = RankGroup.from_env()
    try:
        if not ranks.is_main:
            follow(ranks, build_engine)
            return
        stop = ranks.world_size > 1
        try:
            serve_client_api(args, ranks=ranks)
        except RanksOutOfStep:
            stop = False  # the others are inside a collective no message reaches: torchrun stops them
            raise
        finally:
            if stop:
                ranks.send(STOP)
    finally:
        ranks.close()


if __name__ == "__main__":
    main()
