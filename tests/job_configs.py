"""What the component-policy tests read off an exported job, and the workspace NVFlare's authorizer asks about."""

from __future__ import annotations

from pathlib import Path


def job_components(node):
    """Every ``{"path": ...}`` component config inside a job config, nested ones (e.g. the persistor's model) too."""
    if isinstance(node, dict):
        if isinstance(node.get("path"), str):
            yield node
        for value in node.values():
            yield from job_components(value)
    elif isinstance(node, list):
        for value in node:
            yield from job_components(value)


class ResourcesWorkspace:
    """What NVFlare's ComponentPathAuthorizer asks of a workspace: where the participant's resources file is."""

    def __init__(self, resources_file: Path):
        self.resources_file = Path(resources_file)

    def get_resources_file_path(self) -> str:
        return str(self.resources_file)

    def get_root_dir(self) -> str:
        """The participant's folder (the one holding ``local/resources.json``)."""
        return str(self.resources_file.parent.parent)
