"""docs/operations.md stays true to the code: its configuration reference is the one
generated from ``BookieConfig``, every key it names exists, its TOML is a valid
configuration, its backup one-liners give a usable ``local://`` store, and every command
of its "Operator's first hour" runs, in order, and shows what the section says."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import walkit
from bookie import BookieConfig
from bookie._bk_conf import MAPPED, PEM_ONLY, REFUSED
from bookie._config import reference
from bookie._main import main as bookie_main
from walkit.metadata import connect

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
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
    unknown = named - set(BookieConfig.keys()) - set(MAPPED) - set(REFUSED) - set(PEM_ONLY)
    assert not unknown, f"docs/operations.md names keys BookieConfig does not have: {sorted(unknown)}"
    assert {"journalMaxGroupWaitMSec", "journalDirectIO", "maxPendingAddBytes", "advertisedAddress"} <= named


def test_the_bk_server_conf_table_names_every_mapped_and_refused_key() -> None:
    text = _doc()
    table = text[text.index("### Starting from BookKeeper's `bk_server.conf`"):text.index("### Running a bookie")]
    missing = [key for key in (*MAPPED, *REFUSED, *PEM_ONLY) if f"`{key}`" not in table]
    assert not missing, f"docs/operations.md's bk_server.conf table does not name {missing}"


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


# --- "Operator's first hour": every command run, in order, against a sandbox of its own ---------

FIRST_HOUR = "## Operator's first hour"
_INDEXED = re.compile(r"(bookie|admin|pid|conf)\.(\d+)$")


def _first_hour_blocks() -> list[tuple[str, str]]:
    """The section's code blocks, in order: (language, text)."""
    text = _doc()
    start = text.index(FIRST_HOUR)
    section = text[start:text.index("\n## ", start + 1)]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def _values(lines: str) -> dict[str, str]:
    """The sandbox's ``key=value`` lines, plus each bookie's and admin endpoint's bare port."""
    values = dict(line.split("=", 1) for line in lines.splitlines() if "=" in line)
    for key, value in list(values.items()):
        kind = _INDEXED.match(key)
        if kind and kind.group(1) in ("bookie", "admin"):
            values[f"{kind.group(1)}_port.{kind.group(2)}"] = value.rsplit(":", 1)[1]
    return values


class _Substitution:
    """The doc's values -> this run's: bookie ``i`` of the doc is bookie ``order[i]`` here
    (the identity until ledger 0's ensemble is known, then the doc's ensemble is this
    run's, in order: placement is random)."""

    def __init__(self, doc: dict[str, str], real: dict[str, str]) -> None:
        self.doc, self.real = doc, real
        self.order = {i: i for i in range(sum(1 for k in real if k.startswith("bookie.")))}

    def follow_ensemble(self, doc_ensemble: list[str], real_ensemble: list[str]) -> None:
        doc = self._numbers(self.doc, doc_ensemble)
        real = self._numbers(self.real, real_ensemble)
        self.order = dict(zip(doc, real))

    def _numbers(self, values: dict[str, str], ensemble: list[str]) -> list[int]:
        """Bookie numbers: the ensemble's, in its order, then the others."""
        ids = [values[f"bookie.{i}"] for i in range(len(self.order))]
        first = [ids.index(b) for b in ensemble]
        return first + [i for i in range(len(ids)) if i not in first]

    def __call__(self, text: str) -> str:
        mapping = {}
        for key, value in self.doc.items():
            kind = re.match(r"(\w+)\.(\d+)$", key)
            real_key = f"{kind.group(1)}.{self.order[int(kind.group(2))]}" if kind else key
            mapping[value] = self.real[real_key]
        pattern = "|".join(re.escape(v) for v in sorted(mapping, key=len, reverse=True))
        return re.sub(rf"(?<![\w-])(?:{pattern})(?![\w-])", lambda m: mapping[m.group(0)], text)


def _shell_env() -> dict[str, str]:
    """``walkit`` and ``python3`` of this virtualenv, importing this tree."""
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=str(ROOT))
    env.pop("WALKIT_METADATA", None)  # the doc names --metadata everywhere
    return env


def _sh(block: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)
    assert done.returncode == 0, f"{block}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _words(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def _shows(output: str, sample: str) -> bool:
    """``sample``'s lines appear in ``output``, together and in order (spacing aside)."""
    have, want = _words(output), _words(sample)
    return any(have[i:i + len(want)] == want for i in range(len(have) - len(want) + 1))


def _ensemble(ledger_show: str) -> list[str]:
    found = re.search(r"entries 0\.\.4:\s+(.+)", ledger_show)
    assert found, ledger_show
    return [b.strip() for b in found.group(1).split(",")]


def _start_sandbox(line: str, env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[str], str]:
    argv = shlex.split(line)
    assert argv[:2] == ["walkit", "sandbox"], argv
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
    assert proc.stdout is not None
    printed = []
    for out in proc.stdout:  # bounded by the test's timeout
        printed.append(out)
        if out.strip() == "ready":
            return proc, "".join(printed)
    proc.wait(30)
    pytest.fail(f"the sandbox exited with {proc.returncode} before it was ready: {''.join(printed)}")


def _check(block: str, out: str, sub: _Substitution, seen: set[str]) -> None:
    """What the section says each step shows."""
    victim = sub(sub.doc["bookie.1"])  # the fragment's first bookie, once the ensemble is known
    if "walkit cluster info" in block:
        assert re.search(r"writable\s+4 bookies", out), out
        seen.add("info")
    elif "range(5)" in block:
        assert out.split() == [f"1/{e}/0" for e in range(5)]
        seen.add("write")
    elif "walkit ledger show 0" in block and "log read" in block:
        assert "order 4" in out
        sub.follow_ensemble(_ensemble(_doc_fragments()), _ensemble(out))
        seen.add("read")
    elif "/metrics" in block:
        assert out.startswith("OK\n") and f'"id": "{victim}"' in out
        assert 'walkit_bookie_requests_total{op="add_entry",status="EOK"} 5.0' in out
        seen.add("admin")
    elif "kill -9" in block:
        assert "does not answer" in out and victim not in out and len(_words(out)) == 1 + 3
        seen.add("kill")
    elif "after the crash" in block:
        assert out.split()[:2] == ["2/0/0", "1/0/0"] and out.rstrip().endswith("2/0/0\tafter the crash")
        seen.add("writable")
    elif "--dry-run" in block:
        assert "moved to" in out and victim not in _ensemble(out[out.rindex("ledger 0"):])
        seen.add("recover")


def _doc_fragments() -> str:
    return next(text for lang, text in _first_hour_blocks() if lang == "text" and "entries 0..4:" in text)


@pytest.mark.timeout(400)
def test_operators_first_hour_runs(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("the section's admin endpoint steps use curl")
    blocks = _first_hour_blocks()
    (start_lang, start), (sample_lang, sample) = blocks[:2]
    assert start_lang == "sh" and sample_lang == "text" and start.count("\n") == 1, "first: the sandbox, its output"
    doc = _values(sample)
    env, cwd = _shell_env(), tmp_path.resolve()
    proc, printed = _start_sandbox(start.replace(doc["data_dir"], str(cwd / "first-hour")), env, cwd)
    try:
        assert [line.split("=")[0] for line in printed.splitlines()] == \
            [line.split("=")[0] for line in sample.splitlines()], "the sample output is not the sandbox's"
        sub = _Substitution(doc, _values(printed))
        seen: set[str] = set()
        out = ""
        for lang, block in blocks[2:]:
            if lang == "sh":
                out = _sh(sub(block), env, cwd)
                _check(block, out, sub, seen)
            else:  # a sample of what the command before prints
                assert _shows(out, sub(block)), f"the doc shows:\n{sub(block)}\nthe command printed:\n{out}"
        assert seen == {"info", "write", "read", "admin", "kill", "writable", "recover"}
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
