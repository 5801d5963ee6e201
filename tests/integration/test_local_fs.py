"""Tidemark's local Hadoop file system (io.tidemark.fs) answers as Hadoop's own, without starting processes."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest


def _hadoop(spark: Any) -> tuple[Any, Any, Any]:
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    return jvm, conf, jvm.org.apache.hadoop.fs


def test_the_sessions_local_file_systems_are_tidemarks(spark) -> None:  # type: ignore[no-untyped-def]
    jvm, conf, fs = _hadoop(spark)
    assert fs.FileSystem.getLocal(conf).getRawFileSystem().getClass().getName() == "io.tidemark.fs.NioRawLocalFileSystem"
    context = fs.FileContext.getFileContext(jvm.java.net.URI("file:///"), conf)
    assert context.getDefaultFileSystem().getClass().getName() == "io.tidemark.fs.NioLocalFs"


def test_permissions_are_set_as_hadoop_sets_them(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, conf, fs = _hadoop(spark)
    local = fs.FileSystem.getLocal(conf)
    perm = fs.permission.FsPermission.createImmutable
    made = tmp_path / "made.bin"
    out = local.create(fs.Path(made.as_uri()), perm(0o640), True, 4096, 1, 1 << 20, None)
    out.write(b"x")
    out.close()
    assert stat.S_IMODE(made.stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / ".made.bin.crc").stat().st_mode) == 0o640  # Hadoop's checksum file too
    assert local.mkdirs(fs.Path((tmp_path / "a" / "b").as_uri()), perm(0o750))
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o750
    raw = local.getRawFileSystem()
    raw.setPermission(fs.Path(made.as_uri()), perm(0o1755))  # the sticky bit: Hadoop's own `chmod`
    assert stat.S_IMODE(made.stat().st_mode) == 0o1755
    with pytest.raises(Exception, match="FileNotFoundException"):
        raw.setPermission(fs.Path((tmp_path / "absent").as_uri()), perm(0o644))


def test_link_status_and_an_exclusive_rename_as_hadoops_own(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    jvm, conf, fs = _hadoop(spark)
    target = tmp_path / "target.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    os.symlink(target, link)
    ours = fs.FileSystem.getLocal(conf).getRawFileSystem()
    hadoops = fs.RawLocalFileSystem()
    hadoops.initialize(jvm.java.net.URI("file:///"), conf)
    for name in (str(link), link.as_uri(), str(target), target.as_uri()):
        mine, theirs = ours.getFileLinkStatus(fs.Path(name)), hadoops.getFileLinkStatus(fs.Path(name))
        assert (mine.isSymlink(), mine.getLen(), str(mine.getPath())) == \
               (theirs.isSymlink(), theirs.getLen(), str(theirs.getPath())), name
    assert ours.getFileLinkStatus(fs.Path(str(link))).isSymlink()

    # Delta's log store commits by this rename: it must refuse an existing target.
    context = fs.FileContext.getFileContext(jvm.java.net.URI("file:///"), conf)
    staged = tmp_path / "staged.json"
    staged.write_text('{"a": 1}')
    rename = getattr(fs, "Options$Rename")
    renames = spark.sparkContext._gateway.new_array(rename, 1)
    renames[0] = rename.NONE
    with pytest.raises(Exception, match="FileAlreadyExistsException"):
        context.rename(fs.Path(staged.as_uri()), fs.Path(target.as_uri()), renames)
    assert target.read_text() == "{}"
    context.rename(fs.Path(staged.as_uri()), fs.Path((tmp_path / "new.json").as_uri()), renames)
    assert (tmp_path / "new.json").read_text() == '{"a": 1}' and not staged.exists()
