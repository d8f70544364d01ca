"""man/ and completions/ are generated from the commands: they must be up to date."""

from pathlib import Path

from nsqcli.cli.docs import COMPLETIONS, completion, man_pages

ROOT = Path(__file__).resolve().parent.parent


def test_man_pages_up_to_date():
    pages = man_pages()
    assert set(pages) == {p.name for p in (ROOT / "man").glob("*.1")}
    for name, text in pages.items():
        assert (ROOT / "man" / name).read_text() == text, f"man/{name} is stale: run scripts/gen-docs"
    assert ".SH EXIT STATUS" in pages["nsqcli-pub.1"] and "NSQCLI_NSQD_TCP_ADDRESS" in pages["nsqcli-pub.1"]


def test_completions_up_to_date():
    for shell, name in COMPLETIONS.items():
        assert (ROOT / "completions" / name).read_text() == completion(shell), \
            f"completions/{name} is stale: run scripts/gen-docs"


def test_completion_answers_subcommands_and_options(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, _NSQCLI_COMPLETE="bash_complete", COMP_WORDS="nsqcli t", COMP_CWORD="1")
    out = subprocess.run([sys.executable, "-m", "nsqcli"], env=env, capture_output=True, text=True).stdout
    assert "plain,tail" in out and "plain,to-file" in out
    env.update(COMP_WORDS="nsqcli tail --for", COMP_CWORD="2")
    out = subprocess.run([sys.executable, "-m", "nsqcli"], env=env, capture_output=True, text=True).stdout
    assert "plain,--format" in out
