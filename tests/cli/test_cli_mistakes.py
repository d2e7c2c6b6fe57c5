"""CLI mistakes are refused with a message naming the value, before any work (issue 22)."""

import pytest

from phalanx._src.cli import train
from phalanx._src.cli.main import build_parser, main


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_train_refuses_a_batch_size_that_is_not_positive(value, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--batch-size-per-replica", value])
    assert info.value.code == 2  # argparse's usage error, before anything is imported
    err = capsys.readouterr().err
    assert f"--batch-size-per-replica: must be a positive int (e.g. 128), got {value!r}" in err


def test_train_run_refuses_a_zero_batch_size_given_directly():
    args = build_parser().parse_args(["train"])
    args.batch_size_per_replica = 0  # e.g. a script that builds the namespace itself
    with pytest.raises(SystemExit, match=r"--batch-size-per-replica must be a positive .*got 0"):
        train.run(args)
