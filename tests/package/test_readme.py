"""The README's example runs as written (with its directories moved under tmp_path)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Each example runs, and prints nothing on stderr and logs no warning (a reader
    copying it would take one for a fault: the ledger example's recovery once made its
    own writer warn that "another client" fenced it)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    for code in blocks:
        code = code.replace("/var/lib/walkit", str(tmp_path))
        with caplog.at_level(logging.WARNING):
            exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
        warned = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
        assert not warned, f"the example logs warnings:\n{code}\n" + "\n".join(warned)
        assert capsys.readouterr().err == "", code
    assert (tmp_path / "journal").is_dir() and (tmp_path / "ledgers" / "COOKIE").is_file()


def test_readme_names_the_two_commands_ci_runs() -> None:
    text = README.read_text()
    assert "./dev main" in text and "./dev test" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "./dev test" in ci


def test_readme_bookie_configuration_is_valid() -> None:
    import tomllib

    from bookie import BookieConfig

    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md shows no bookie.toml"
    for text in blocks:
        config = BookieConfig.from_dict(tomllib.loads(text))
        assert config.metadata_service_uri.startswith("local://")


def test_readme_documents_every_garbage_collection_key_with_its_default() -> None:
    from bookie import BookieConfig

    text = README.read_text()
    section = text[text.index("### Garbage collection"):]
    section = section[:section.index("```sh")]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    documented: dict[str, str] = {}
    for keys, defaults in rows:
        names = re.findall(r"`(\w+)`", keys)
        values = [v.split(" (")[0].strip() for v in defaults.split(",")]
        documented.update(zip(names, values if len(values) == len(names) else values * len(names)))
    defaults = BookieConfig().to_dict()
    gc_keys = {k for k in defaults if k.startswith(("gc", "minorCompaction", "majorCompaction", "compactionRate"))
               or k in ("isThrottleByBytes", "isForceGCAllowWhenNoSpace", "diskUsageWarnThreshold")}
    assert gc_keys <= set(documented), gc_keys - set(documented)
    for key in gc_keys:
        value = defaults[key]
        shown = documented[key]
        assert shown == (str(value).lower() if isinstance(value, bool) else f"{value:.2f}" if key ==
                         "diskUsageWarnThreshold" else str(value)), (key, shown, value)


def _assert_key_table(heading: str, keys: set[str]) -> None:
    """The first "| key | default |" table after ``heading`` shows each of ``keys`` (one
    per row) with BookieConfig's default ("" for an empty string, units in parentheses)."""
    from bookie import BookieConfig

    text = README.read_text()
    section = text[text.index(heading):]
    section = section[section.index("| key |"):]
    section = section[:section.index("\n\n")]
    rows = {re.findall(r"`(\w+)`", line.split("|")[1])[0]: line.split("|")[2].split(" (")[0].strip()
            for line in section.splitlines() if line.startswith("| `")}
    defaults = BookieConfig().to_dict()
    assert keys <= set(defaults) and keys <= set(rows), keys - set(rows)
    for key in keys:
        value = defaults[key]
        shown = str(value).lower() if isinstance(value, bool) else '""' if value == "" else str(value)
        assert rows[key] == shown, (key, rows[key], value)


def test_readme_documents_every_autorecovery_key_with_its_default() -> None:
    _assert_key_table("### Recovery of lost bookies", {
        "autoRecoveryDaemonEnabled", "lostBookieRecoveryDelay", "auditorPeriodicCheckInterval",
        "auditorPeriodicBookieCheckInterval", "openLedgerRereplicationGracePeriod"})


def test_readme_documents_every_metadata_key_with_its_default() -> None:
    _assert_key_table("### Metadata", {"metadataServiceUri", "zkTimeout", "metadataRetryDeadlineMs"})
