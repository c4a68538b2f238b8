"""Jars from Maven Central, resolved once into the cache directory with `mvn`.

Used for the local Kafka broker (txstream/local/cluster.py) and the Spark Structured Streaming
benchmark contender's connectors. Maven does the resolution (transitive dependencies, exclusions,
its own local repository); this module writes the pom, runs it, reports progress and marks a
complete result so an interrupted download is redone rather than used.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from txstream.errors import UserError
from txstream.local.paths import cache_dir


class MavenError(UserError):
    """`mvn` is missing or could not resolve the artifacts."""


@dataclass(frozen=True)
class Artifact:
    group: str
    artifact: str
    version: str
    # (groupId, artifactId) pairs left out of this artifact's dependencies; "*" matches all.
    exclusions: tuple[tuple[str, str], ...] = ()

    def xml(self) -> str:
        excluded = "".join(f"<exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
                           for g, a in self.exclusions)
        return (f"<dependency><groupId>{self.group}</groupId><artifactId>{self.artifact}</artifactId>"
                f"<version>{self.version}</version>"
                + (f"<exclusions>{excluded}</exclusions>" if excluded else "") + "</dependency>")


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txstream.local</groupId><artifactId>{name}</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    {dependencies}
  </dependencies>
</project>
"""


def resolve(name: str, artifacts: Sequence[Artifact], progress: Callable[[str], None] = lambda _m: None,
            what: str = "jars", missing_hint: str = "") -> Path:
    """The directory of `artifacts`' jars (runtime scope, transitive), `cache_dir()/name/libs`.

    Resolved on first use only: the directory counts once `name/.complete` exists. Raises
    MavenError when `mvn` is not on PATH (with `missing_hint`) or fails (with its last lines)."""
    work = cache_dir() / name
    libs = work / "libs"
    done = work / ".complete"
    if done.exists():
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise MavenError(f"Maven (`mvn`) was not found on PATH. txstream resolves {what} from Maven "
                         "Central with it: install Maven (e.g. `apt-get install maven`)"
                         + (f", or {missing_hint}" if missing_hint else "") + ".")
    work.mkdir(parents=True, exist_ok=True)
    pom = work / "pom.xml"
    pom.write_text(_POM.format(name=name, dependencies="\n    ".join(a.xml() for a in artifacts)))
    partial = work / "libs.partial"
    shutil.rmtree(partial, ignore_errors=True)
    progress(f"Resolving {what} from Maven Central into {libs} (first use only) ...")
    proc = subprocess.Popen(
        [mvn, "-B", "-f", str(pom), "dependency:copy-dependencies",
         f"-DoutputDirectory={partial}", "-DincludeScope=runtime"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    downloaded = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-30:]
        if line.startswith("Downloaded from") and line.rstrip().endswith(".jar"):
            downloaded += 1
            if downloaded % 10 == 0:
                progress(f"  ... {downloaded} jars downloaded")
    if proc.wait() != 0:
        raise MavenError(f"Maven could not resolve {what} (pom: {pom}):\n" + "\n".join(tail))
    shutil.rmtree(libs, ignore_errors=True)
    partial.rename(libs)
    done.touch()
    progress(f"  {what}: {len(list(libs.glob('*.jar')))} jars ready.")
    return libs
