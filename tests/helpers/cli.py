"""Running the command line in-process, as the unit tests of ``launcher.commands`` do."""

from launcher.commands.cli import main


def run_cli(capsys, *argv):
    """``launcher ARGV...`` in this process: (exit status, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
