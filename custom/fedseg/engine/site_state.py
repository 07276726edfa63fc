"""A site's training state on disk, so that a restarted site process continues where it stopped.

What a site keeps between rounds besides the weights the server sends: the optimiser's state (Adam's
moments and step counts, which the engine keeps per model across rounds) and the generator that
shuffles its training data. ``SiteState`` writes both into ``<site workspace>/fedseg_state/<site>/``
(``RoundContext.state_dir``, one file per round) after every train task, before the result is sent, and a fresh
process loads them before its first training. The DP accountant (``fedseg.engine.privacy``, ``dp_accountant.json``)
lives in the same folder and is restored by its owner. The baselines'
per-site state (SCAFFOLD's control, MOON's and FedCE's previous local model, FedDyn's linear term, Ditto's
personal model, FedBN's / FedRep's local layers) is kept by :class:`RoundRecords`, with the same rules.

Nothing counted twice. The folder holds the state *after* each of the last :data:`KEEP` train tasks,
keyed by round. A task of round ``r`` restores the newest record of a round ``< r``: when the server
re-sends a round the site had already trained before a crash (a resumed server redoes the round in
progress), the site starts from the state before that round, not after it, so that round's Adam steps
are not applied twice. Round 0 never restores (a new job), nor does a process that has already
trained (its state is in memory), nor a record written by a job with another configuration
(``job_key``). The file stays at the site: it is never sent.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

logger = logging.getLogger(__name__)

#: the state after one train task: ``site_state_<round>.pt`` (one file per round, so that a save writes only the
#: newest state and never reads the others back)
STATE_FILE = "site_state_{round}.pt"
#: train tasks whose after-state is kept (the newest and the one before it)
KEEP = 2
FORMAT = 2


def job_key(*parts: Any) -> str:
    """A short fingerprint of a job's configuration (objective, its options, train_config)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


class SiteState:
    """Save and restore a site's optimiser and data-order state across process restarts.

    Args:
        state_dir: the site's state folder (``RoundContext.state_dir``).
        key: ``job_key(...)`` of the job this process runs.
    """

    def __init__(self, state_dir: os.PathLike, key: str):
        self.folder = Path(state_dir)
        self.key = key
        #: the round whose after-state this process restored (None: fresh start or nothing restored)
        self.restored_round: Optional[int] = None
        self._checked = False

    def path(self, round_: int) -> Path:
        """The file of the state after ``round_``'s train task."""
        return self.folder / STATE_FILE.format(round=int(round_))

    def rounds(self) -> List[int]:
        """The rounds whose after-state is on disk, oldest first."""
        found = []
        for p in self.folder.glob(STATE_FILE.format(round="*")):
            stem = p.name[len(STATE_FILE.split("{")[0]):-len(".pt")]
            if stem.isdigit():
                found.append(int(stem))
        return sorted(found)

    def _read(self, round_: int) -> Dict[str, Any]:
        path = self.path(round_)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a damaged file must not stop the site: it trains from a fresh optimiser
            logger.warning("site state %s unreadable (%s): starting from a fresh optimiser", path, e)
            return {}
        if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("key") != self.key:
            logger.info("site state %s belongs to another job configuration: not used", path)
            return {}
        return state

    def save(self, round_: int, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> Path:
        """Record the state after the train task of ``round_`` (atomic replace); a re-run of a round drops the states
        of that round and later ones (about to be redone); the last KEEP rounds are kept."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path(round_)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, "key": self.key, "round": int(round_), "optimizer": optimizer.state_dict(),
                        "generator": generator.get_state()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        kept = [r for r in self.rounds() if r < round_][-(KEEP - 1):] + [int(round_)] if KEEP > 1 else [int(round_)]
        for r in self.rounds():
            if r not in kept:
                self.path(r).unlink(missing_ok=True)
        return path

    def restore(self, round_: int, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> Optional[int]:
        """Before the first training of this process: load the newest after-state of a round < ``round_``.

        Returns the round restored from, or None. Checked once per process: later tasks use the state in
        memory. ``optimizer`` must be the one training will use, still without state.
        """
        if self._checked:
            return None
        self._checked = True
        if round_ <= 0 or optimizer.state:
            return None
        earlier = [r for r in self.rounds() if r < round_]
        if not earlier:
            return None
        last = earlier[-1]
        state = self._read(last)
        if not state:
            return None
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        self.restored_round = last
        logger.info("site state restored from %s: optimiser and data order after round %d", self.path(last), last)
        return last


class RoundRecords:
    """An objective's per-round site state, in memory and in ``<state_dir>/<name>.pt``, by the rules above.

    ``save(r, record)`` stores the state *after* the train task of round ``r`` (and drops any record of a
    round ``>= r``: a re-sent round replaces what the crashed attempt wrote); ``before(r)`` returns the
    newest record of a round ``< r``, so a round the server re-sends starts from the state before it. The
    last :data:`KEEP` records are kept. Records written under another ``key`` (another job configuration)
    are ignored. Without a ``state_dir`` the records live in memory only (unit tests).

    Args:
        state_dir: the site's state folder (``RoundContext.state_dir``) or None.
        name: file stem, e.g. ``"scaffold_control"``.
        key: the job's fingerprint (``RoundContext.job_key``).
    """

    def __init__(self, state_dir: Optional[os.PathLike], name: str, key: Optional[str]):
        self.path = Path(state_dir) / f"{name}.pt" if state_dir else None
        self.key = key
        self._records: Optional[Dict[int, Dict[str, Any]]] = None

    def _load(self) -> Dict[int, Dict[str, Any]]:
        if self._records is not None:
            return self._records
        self._records = {}
        if self.path is not None and self.path.is_file():
            try:
                state = torch.load(self.path, map_location="cpu", weights_only=True)
            except Exception as e:  # a damaged file: start afresh rather than stop the site
                logger.warning("site records %s unreadable (%s): starting without them", self.path, e)
                return self._records
            if isinstance(state, dict) and state.get("format") == FORMAT and state.get("key") == self.key:
                self._records = {int(r): v for r, v in state.get("records", {}).items()}
            else:
                logger.info("site records %s belong to another job configuration: not used", self.path)
        return self._records

    def save(self, round_: int, record: Dict[str, Any]) -> None:
        """Keep ``record`` (CPU tensors, numbers, strings, lists, dicts) as the state after round ``round_``."""
        records = {r: v for r, v in self._load().items() if r < round_}
        records[int(round_)] = record
        self._records = {r: records[r] for r in sorted(records)[-KEEP:]}
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, "key": self.key, "records": self._records}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)  # a restart mid-write must not leave a truncated file behind

    def before(self, round_: int) -> Optional[Tuple[int, Dict[str, Any]]]:
        """``(round, record)`` of the newest record of a round ``< round_``, or None."""
        earlier = [r for r in self._load() if r < round_]
        if not earlier:
            return None
        last = max(earlier)
        return last, self._records[last]
