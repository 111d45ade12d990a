"""docs/operations.md stays true to the code: its configuration reference is the one
generated from ``BookieConfig``, every key it names exists, its TOML is a valid
configuration, and its backup one-liners give a usable ``local://`` store."""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import walkit
from bookie import BookieConfig
from bookie._config import reference
from bookie._main import main as bookie_main
from walkit.metadata import connect

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
START, END = "<!-- config-reference: start -->", "<!-- config-reference: end -->"
REGENERATE = ("regenerate it: `.venv/bin/python -m bookie --config-reference` and paste its output "
              f"between `{START}` and `{END}` in docs/operations.md")
#: camelCase words in backquotes that are not bookie keys: a file, ZooKeeper's settings.
NOT_KEYS = {"lastMark", "dataDir", "maxSessionTimeout"}


def _doc() -> str:
    return DOC.read_text()


def test_every_key_has_a_one_line_description() -> None:
    for f in dataclasses.fields(BookieConfig):
        doc = f.metadata.get("doc", "")
        assert doc.strip(), f"{f.metadata['key']} has no description: give it one in _key(key, default, doc)"
        assert "|" not in doc and "\n" not in doc, f"{f.metadata['key']}: one line, no '|' (a Markdown table cell)"


def test_embedded_reference_is_the_generated_one() -> None:
    text = _doc()
    assert text.count(START) == 1 and text.count(END) == 1, f"docs/operations.md needs the markers; {REGENERATE}"
    embedded = text[text.index(START) + len(START):text.index(END)].strip("\n")
    assert embedded == reference().strip("\n"), f"the configuration reference is out of date; {REGENERATE}"


def test_config_reference_flag_prints_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert bookie_main(["--config-reference"]) == 0
    assert capsys.readouterr().out == reference()


def test_every_key_named_in_the_doc_exists() -> None:
    text = _doc()
    named = set(re.findall(r"`([a-z]+(?:[A-Z][a-zA-Z]*)+)`", text)) - NOT_KEYS
    for block in re.findall(r"```toml\n(.*?)```", text, flags=re.S):
        named |= set(tomllib.loads(block))
    unknown = named - set(BookieConfig.keys())
    assert not unknown, f"docs/operations.md names keys BookieConfig does not have: {sorted(unknown)}"
    assert {"journalMaxGroupWaitMSec", "journalDirectIO", "maxPendingAddBytes", "advertisedAddress"} <= named


def test_toml_examples_are_valid_configurations() -> None:
    blocks = re.findall(r"```toml\n(.*?)```", _doc(), flags=re.S)
    assert blocks
    for block in blocks:
        BookieConfig.from_dict(tomllib.loads(block))


def _one_liners() -> list[str]:
    """The documented backup and check commands (python3 -c lines on metadata.sqlite)."""
    lines = [line for block in re.findall(r"```sh\n(.*?)```", _doc(), flags=re.S) for line in block.splitlines()
             if line.startswith("python3 -c ") and "metadata.sqlite" in line]
    assert len(lines) == 2 and "backup(" in lines[0] and "integrity_check" in lines[1], lines
    return lines


def _run(line: str, store: Path, backups: Path) -> str:
    argv = shlex.split(line, comments=True)
    argv = [sys.executable] + [a.replace("/var/lib/walkit/md", str(store)).replace("/var/backups/walkit", str(backups))
                               for a in argv[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_backup_one_liner_gives_a_usable_local_store(tmp_path: Path) -> None:
    backup, check = _one_liners()
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    with walkit.LocalCluster(str(tmp_path / "cluster"), bookies=3) as cluster:
        store = Path(cluster.metadata_uri.removeprefix("local://"))
        assert (store / "metadata.sqlite").is_file()
        with cluster.client() as bk:
            lh = bk.create_ledger(3, 2, 2, password=b"pw")
            for i in range(5):
                lh.add_entry(b"entry %d" % i)
            lh.close()
            _run(backup, store, copy_dir)  # online: the cluster and its client keep the store open
            later = bk.create_ledger(3, 2, 2, password=b"pw").ledger_id
        assert _run(check, store, copy_dir).strip() == "ok"
        with connect(f"local://{copy_dir}") as copy, connect(cluster.metadata_uri) as live:
            assert copy.info == live.info
            assert set(copy.ledgers.ledger_ids()) == {lh.ledger_id} and later in set(live.ledgers.ledger_ids())
        with walkit.BookKeeper(f"local://{copy_dir}") as restored:   # the copy serves a client of the bookies
            rh = restored.open_ledger(lh.ledger_id, password=b"pw")
            assert rh.is_closed and [e.data for e in rh.read(0, 4)] == [b"entry %d" % i for i in range(5)]
