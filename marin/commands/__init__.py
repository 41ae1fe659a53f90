"""The modules of one ``marin`` command each (lineage, publish, diff, sweep, status), imported only by
:mod:`marin.cli_commands`; what they share lives below them."""
