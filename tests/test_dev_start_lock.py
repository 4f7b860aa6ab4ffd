"""Two `hpctrain dev start` of one name at the same time: the second is refused, in one line, before it submits
anything or touches the session's token file. The first holds the session's start lock (as `dev start` does while
it submits and waits); here the test holds it, and the second is the real CLI."""

from __future__ import annotations

from pathlib import Path

from around_helpers import cli_env, hpctrain
from hpctrain.servers.sessions import START_LOCK, TOKEN_FILE, starting


def test_a_second_dev_start_of_one_name_is_refused_while_the_first_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = cli_env(home, KUBECONFIG=str(tmp_path / "no-kubeconfig"))  # were it not refused: no pod anywhere
    with starting("twin", home / "dev") as state_dir:
        (state_dir / TOKEN_FILE).write_text("the first start's token\n")
        for scheduler, image in (("slurm", ()), ("kubernetes", ("--image", "img:1"))):
            second = hpctrain(
                *("dev", "start", "twin", "--scheduler", scheduler, *image, "--wait", "1", "--time", "1"),
                env=env,
                cwd=tmp_path,
            )  # a session the backend would render (it refuses one it cannot, before taking the lock)
            assert second.returncode == 2 and "Traceback" not in second.stderr, second
            assert second.stderr.strip() == (
                "hpctrain dev: error: dev session twin is being started right now by another `hpctrain dev start`: "
                "wait for it, then see `hpctrain dev list`; or start this one under another name"
            ), second.stderr
        assert sorted(p.name for p in state_dir.iterdir()) == [START_LOCK, TOKEN_FILE]  # nothing submitted
        assert (state_dir / TOKEN_FILE).read_text() == "the first start's token\n"
    with starting("twin", home / "dev"):  # the lock went with its holder: the name can start again
        pass


def test_a_start_lock_that_is_not_a_plain_file_is_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    lock = home / "dev" / "odd" / START_LOCK
    lock.parent.mkdir(parents=True)
    lock.symlink_to(tmp_path / "elsewhere")
    proc = hpctrain("dev", "start", "odd", "--scheduler", "slurm", "--wait", "1", env=cli_env(home), cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc
    assert f"cannot open its lock {lock}" in proc.stderr and not (tmp_path / "elsewhere").exists()
