"""`hpctrain dev start --service ssh|code` on the local Slurm cluster.

ssh: a real sshd (openssh-server) runs in the job as the user, and the real ssh client logs in with the key given
to --ssh-key, checking the session's own host key (known_hosts written by start), and runs a command.

code: the VS Code CLI cannot be installed here (no internet), so `code` is a STAND-IN on PATH (written below) that
prints what `code tunnel --accept-server-license-terms --name NAME` prints (the license banner, the GitHub
device-login line, then the vscode.dev link once the login is done) and records its arguments.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from around_helpers import cli_env, hpctrain
from hpctrain.servers.code import tunnel_name
from hpctrain.servers.sessions import DevConfig
from hpctrain.servers.ssh import find_public_key, render_sshd_config
from hpctrain.errors import UserError
from hpctrain.servers.common import tcp_banner


def keypair(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    key = where / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def test_public_key_is_found_or_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with pytest.raises(UserError, match="ssh-keygen -t ed25519"):
        find_public_key(None, home)
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa.pub").write_text("ssh-rsa AAAAB3Nza me@laptop\n")
    (home / ".ssh" / "id_ed25519.pub").write_text("ssh-ed25519 AAAAC3Nza me@laptop\n")
    assert find_public_key(None, home).name == "id_ed25519.pub"
    private = tmp_path / "id_ed25519"
    private.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(UserError, match="never the private key"):
        find_public_key(private)


def test_an_ssh_key_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    """Guards issue 17: `--ssh-key /dev/zero` was read until memory ran out (a FIFO would hang)."""
    os.mkfifo(tmp_path / "fifo.pub")
    for given in (Path("/dev/zero"), tmp_path / "fifo.pub"):
        with pytest.raises(UserError, match="--ssh-key .*: not a regular file"):
            find_public_key(given)


def test_sshd_config_lets_only_the_user_in_with_a_key(tmp_path: Path) -> None:
    text = render_sshd_config(tmp_path / "a 50% dir", "alice")
    assert f'AuthorizedKeysFile "{tmp_path}/a 50%% dir/authorized_keys"' in text
    assert "AllowUsers alice" in text and "PasswordAuthentication no" in text
    with pytest.raises(UserError, match="HPCTRAIN_HOME"):
        render_sshd_config(tmp_path / 'say "hi"', "alice")


def test_tunnel_names_fit_the_vs_code_cli() -> None:
    assert tunnel_name("nb") == "dev-nb"
    long_a, long_b = tunnel_name("x" * 30 + "-a"), tunnel_name("x" * 30 + "-b")
    assert len(long_a) <= 20 and long_a != long_b and long_a.startswith("dev-xxx")
    with pytest.raises(UserError, match="--ssh-key is for --service ssh"):
        DevConfig("nb", ssh_key=Path("k.pub"))


@pytest.mark.slurm
def test_ssh_session_on_slurm(slurm_cluster, tmp_path: Path) -> None:
    if not (shutil.which("sshd") or Path("/usr/sbin/sshd").exists()) or not shutil.which("ssh"):
        pytest.fail("openssh-server and openssh-client must be installed (scripts/test.sh installs them)")
    key = keypair(tmp_path / "keys")
    env = cli_env(tmp_path / "home")
    started = hpctrain(
        "dev",
        "start",
        "sh",
        "--service",
        "ssh",
        "--ssh-key",
        f"{key}.pub",
        "--scheduler",
        "slurm",
        "--cpus",
        "1",
        "--wait",
        "500",
        "--login-host",
        "login.example",
        env=env,
        cwd=tmp_path,
    )
    state = tmp_path / "home" / "dev" / "sh"
    conn = json.loads((state / "connection.json").read_text()) if (state / "connection.json").exists() else {}
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        user = getpass.getuser()
        assert f"ssh -J login.example -p {conn['port']} {user}@{conn['node']}" in started.stdout
        assert "ProxyJump login.example" in started.stdout and conn["host_key_fingerprint"] in started.stdout
        for name in ("sshd_config", "authorized_keys", "known_hosts", "ssh_host_ed25519_key", "connection.json"):
            assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
        assert tcp_banner(conn["node"], conn["port"]).startswith(b"SSH-2.0-OpenSSH")
        # The printed ~/.ssh/config block, as the user would paste it; no sshd runs on a login node here, so the
        # jump is dropped (node1 is this host). The host key must be the session's own: StrictHostKeyChecking=yes.
        config = tmp_path / "ssh_config"
        config.write_text(conn["ssh_config"] + f"    IdentityFile {key}\n    IdentitiesOnly yes\n")
        login = subprocess.run(
            [
                "ssh",
                "-F",
                str(config),
                "-o",
                "ProxyJump=none",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                f"UserKnownHostsFile={state / 'known_hosts'}",
                "hpctrain-dev-sh",
                "echo logged-in-$((6*7)) as $(id -un)",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert login.returncode == 0, login.stderr
        assert login.stdout.strip() == f"logged-in-42 as {user}"
        # Another key is turned away.
        other = keypair(tmp_path / "other")
        refused = subprocess.run(
            [
                "ssh",
                "-F",
                "/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "IdentitiesOnly=yes",
                "-i",
                str(other),
                "-p",
                str(conn["port"]),
                f"{user}@127.0.0.1",
                "true",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode == 255 and "Permission denied" in refused.stderr
        stopped = hpctrain("dev", "stop", "sh", env=env)
        assert stopped.returncode == 0 and "cancelled" in stopped.stdout, stopped.stdout + stopped.stderr
        assert tcp_banner(conn["node"], conn["port"]) == b""
        assert not (state / "ssh_host_ed25519_key").exists() and not (state / "connection.json").exists()
    finally:
        if conn.get("job_id"):
            slurm_cluster.cancel_quietly(conn["job_id"])


CODE_STANDIN = r"""#!/bin/sh
# STAND-IN for the VS Code CLI (`code tunnel`), which cannot be installed here: prints what the real one prints.
printf '%s\n' "$*" >> "$CODE_STANDIN_LOG"
cat <<'BANNER'
*
* Visual Studio Code Server
*
* By using the software, you agree to
* the Visual Studio Code Server License Terms (https://aka.ms/vscode-server-license) and
* the Microsoft Privacy Statement (https://privacy.microsoft.com/en-US/privacystatement).
*
BANNER
name=""
while [ $# -gt 0 ]; do [ "$1" = "--name" ] && name="$2"; shift; done
login_hint="run \`code tunnel user login --provider <provider>\` option to change this."
echo "[2026-01-05 10:00:00] info Using GitHub for authentication, $login_hint"
echo "To grant access to the server, please log into https://github.com/login/device and use code 3F2A-91BC"
sleep 2
echo "[2026-01-05 10:00:09] info Creating tunnel with the name: $name"
echo "Open this link in your browser https://vscode.dev/tunnel/$name$PWD"
exec sleep 600
"""


@pytest.mark.slurm
def test_code_tunnel_session_on_slurm(slurm_cluster, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "code").write_text(CODE_STANDIN)
    (bin_dir / "code").chmod(0o755)
    log = tmp_path / "code-calls.txt"
    # sbatch exports the caller's environment, PATH included: the job finds the stand-in.
    env = cli_env(tmp_path / "home", path_prefix=bin_dir, CODE_STANDIN_LOG=str(log))
    name = "tunnel-" + "x" * 20
    started = hpctrain(
        "dev",
        "start",
        name,
        "--service",
        "code",
        "--scheduler",
        "slurm",
        "--cpus",
        "1",
        "--wait",
        "500",
        env=env,
        cwd=tmp_path,
    )
    state = tmp_path / "home" / "dev" / name
    conn = json.loads((state / "connection.json").read_text()) if (state / "connection.json").exists() else {}
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        tunnel = tunnel_name(name)
        assert log.read_text().split() == ["tunnel", "--accept-server-license-terms", "--name", tunnel]
        assert "open https://github.com/login/device and enter the code 3F2A-91BC" in started.stdout
        assert f"https://vscode.dev/tunnel/{tunnel}/" in started.stdout and conn["url"].startswith(
            f"https://vscode.dev/tunnel/{tunnel}/"
        )
        stopped = hpctrain("dev", "stop", name, env=env)
        assert stopped.returncode == 0 and "cancelled" in stopped.stdout, stopped.stdout + stopped.stderr
    finally:
        if conn.get("job_id"):
            slurm_cluster.cancel_quietly(conn["job_id"])


@pytest.mark.slurm
def test_code_tunnel_without_the_cli_is_refused(slurm_cluster, tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home")
    if any(os.access(Path(d) / "code", os.X_OK) for d in env["PATH"].split(os.pathsep) if d):
        pytest.skip("a `code` executable is installed on this machine")
    started = hpctrain(
        "dev",
        "start",
        "nocode",
        "--service",
        "code",
        "--scheduler",
        "slurm",
        "--cpus",
        "1",
        "--wait",
        "500",
        env=env,
        cwd=tmp_path,
    )
    assert started.returncode == 2, started.stdout + started.stderr
    assert "the VS Code CLI (code) is not on PATH on" in started.stderr and "Traceback" not in started.stderr
