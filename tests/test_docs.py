"""The documentation a reader finishes: the README short, with the two commands on its first screen; the results
overview short; every page reachable from the README and every link and anchor resolving; and nothing of the old
README lost in the move to the user guide (each command it showed is still shown)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Set

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
OVERVIEW = REPO / "docs" / "benchmarks.md"
#: lines a reader sees without scrolling
FIRST_SCREEN = 30

#: every command the README showed before the user guide (its code blocks, continuation lines joined and comments
#: dropped, and its inline commands): each must still be shown in the README or a page under docs/
OLD_README_COMMANDS = [
    'pip install torch==2.13.0 && pip install -e . && python -m fedseg.fl.component_policy --simulator workspaces/graphfedseg && FEDSEG_NUM_THREADS=1 nvflare simulator jobs/graphfedseg -w workspaces/graphfedseg -n 4 -t 4 && fedseg summarise workspaces/graphfedseg',
    'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q',
    'python jobs/job.py graphfedseg --env sim -n 4',
    'from nvflare.recipe import SimEnv',
    'from fedseg.recipes.graphfedseg import GraphFedSegRecipe',
    'run = GraphFedSegRecipe(num_rounds=2).execute(SimEnv(num_clients=2))',
    'print(run.get_result())',
    'fedseg data retina --src DATA/retina_vessels --out data/retina',
    'fedseg data check data/retina/*/datalist.json',
    'fedseg run fedavg --site-datalists data/retina/site_datalists.json -w workspaces/retina',
    'fedseg data nuclei --src DATA/nuclei_he --out data/nuclei_source --layout source',
    'fedseg data nuclei --src DATA/nuclei_he --out data/nuclei_organ --layout organ',
    'fedseg run fedavg --site-datalists data/nuclei_source/site_datalists.json -w workspaces/nuclei',
    'fedseg data synth --family fundus --sites site-1 site-2 site-3 --out data/fundus',
    'fedseg run fedevi --family fundus -n 3',
    'fedseg data odoc --src DATA/odoc_prostate_samples --out data/odoc',
    'fedseg data odoc --src DATA/odoc_prostate_samples --out data/prostate --task prostate',
    'fedseg export --method fedevi --labels-from data/odoc/Drishti-GS/datalist.json --out my_jobs',
    'fedseg data synth --family prostate3d --sites site-1 site-2 site-3 --out data/prostate3d',
    'fedseg run fedavg --family prostate3d -n 3',
    'fedseg run fedevi --family prostate3d -n 3 --set spatial_mode=slices slice_foreground_only=true',
    'fedseg infer --checkpoint workspaces/fedavg/server/simulate_job/app_server/FL_global_model.pt --input NEW_SCANS/ --output MASKS/',
    'fedseg data synth --family polyp|vessel|nuclei|xray|fundus|prostate3d --sites site-1 site-2 --out DIR [--profile tiny|default|paper]',
    'fedseg data retina --src PATH --out DIR [--rescale CHASE_DB1=0.5] [--participants DRIVE=3,...]',
    'fedseg data nuclei --src PATH --out DIR --layout source|organ [--organs ...] [--min-images 6] [--val-fraction 0.15]',
    '[--test-fraction 0.2] [--seed 0]',
    'fedseg data odoc --src PATH --out DIR [--task fundus|prostate] [--sites ...]',
    'fedseg data check DATALIST ...',
    'fedseg export [--method M | --all] [--profile default|paper]',
    '[--family F | --labels-from DATALIST] [--set key=value ...]',
    'fedseg run METHOD [-n 3] [--profile ...] [--rounds R] [--site-datalists FILE] [--seed S] [--set key=value ...]',
    'fedseg bench --out DIR (--site-datalists FILE | --family polyp|vessel|nuclei|fundus|prostate3d [--sites ...] [--data-profile P])',
    '--methods fedavg graphfedseg fedevi ... [--references local pooled] [--seeds 0 1 2]',
    '[--rounds R] [--local-epochs E] [--profile ...] [--protocol METHOD] [--set key=value ...] [--reuse OTHER_DIR ...]',
    '[--parallel N]',
    'fedseg summarise WORKSPACE_OR_REPORT',
    'fedseg infer --checkpoint FL_global_model.pt --input NEW_SCANS/ --output MASKS/ [--bundle bundles/unetr_seg]',
    '[--datalist D --split test] [--label-values JSON | --class-indices] [--largest-component]',
    'fedseg bench --site-datalists my_sites.json --methods fedavg graphfedseg fedevi fvac graph_lastU=graphfedseg:uncertainty_pass=last_epoch --references local pooled --seeds 0 1 2 --rounds 10 --local-epochs 1 --set image_size=128 --out bench_my_sites',
    'fedseg bench --methods fedavg fedprox scaffold fedadam fedbn ditto fedrep moon feddyn fedce graphfedseg ...',
    'python jobs/job.py graphfedseg --server-optimizer sgd-momentum',
    'fedseg export --server-optimizer adam',
    'fedseg bench',
    'python benchmarks/reproduce.py glance',
    'python benchmarks/reproduce.py --update-page README.md',
    'fedseg infer',
    'python -m fedseg.fl.component_policy --simulator WS',
    'fedseg run',
    'fedseg summarise WS',
    'nvflare simulator',
    'pip install -e .',
    'python jobs/job.py graphfedseg --help',
    'fedseg export',
    'python -m pytest -q -m "not slow"',
    'fedseg summarise',
    'export FEDSEG_DATASETS=DATA',
    'fedseg data odoc',
    'fedseg infer --stitch-device cpu',
    'fedseg export --profile paper --out my_jobs',
    'fedseg bench --profile paper',
    'python jobs/job.py fedavg --env poc',
    'python poc_workspace/run_poc.py --job jobs/fedavg',
    'python jobs/job.py fedavg --env prod --startup-kit ADMIN_KIT',
    'nvflare simulator jobs/fedavg -n 4 -t 4 -gpu 0',
    'python benchmarks/gpu/gpu_check.py --out gpu_check',  # the script has since moved beside its results page
    'fedseg export --task-request-interval 0.05',
]

def _pages() -> List[Path]:
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def _flat(text: str) -> str:
    """``text`` with code lines' backslash continuations joined and every run of white space one space."""
    return " ".join(re.sub(r"\\\n", " ", text).split())


def test_the_readme_and_the_results_overview_stay_short():
    assert len(README.read_text().splitlines()) <= 200
    assert len(OVERVIEW.read_text().splitlines()) <= 300


def test_the_two_commands_are_on_the_first_screen_and_ci_runs_the_test_command():
    lines = README.read_text().splitlines()
    first = lines[:FIRST_SCREEN]
    run = next(i for i, line in enumerate(first) if line.startswith("pip install torch==") and "nvflare simulator" in line)
    test = next(i for i, line in enumerate(first) if line.startswith("pip install torch==") and "pytest" in line)
    assert "## Two commands" in first[:run]
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("pip install")]
    assert ci == [lines[test]]


def test_every_command_the_old_readme_showed_is_still_shown():
    shown = " ".join(_flat(page.read_text()) for page in _pages())
    assert [command for command in OLD_README_COMMANDS if command not in shown] == []


def _anchors(page: Path) -> Set[str]:
    """Explicit ``<a id>`` anchors and GitHub's heading slugs (lower case, punctuation dropped, spaces as hyphens)."""
    text = page.read_text()
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        ids.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return ids


def _links(page: Path) -> List[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"^[a-z]+:", t)]


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in _pages():
        for target in _links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such anchor)")
    assert broken == []


def test_every_page_of_the_docs_is_reachable_from_the_readme():
    seen, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for target in _links(page):
            dest = (page.parent / target.partition("#")[0]).resolve()
            if dest.suffix == ".md" and dest.is_file() and dest not in seen:
                seen.add(dest)
                todo.append(dest)
    unreached = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md") if p.resolve() not in seen)
    assert unreached == []
    guide = sorted(p.name for p in (REPO / "docs" / "guide").glob("*.md"))
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _links(README)}
    assert [n for n in guide if (REPO / "docs" / "guide" / n).resolve() not in linked] == []
