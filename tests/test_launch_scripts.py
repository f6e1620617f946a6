"""launch/ray_two_nodes.sh sets the network-interface variables only when it is given one.

The script runs with a stand-in ``ray`` on PATH that prints the environment it was started with,
so nothing joins or starts a cluster.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "launch" / "ray_two_nodes.sh"
IFACE_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def run_worker(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The worker role with a fake ``ray`` that prints the interface variables it inherited."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake_ray = bin_dir / "ray"
    fake_ray.write_text(
        "#!/usr/bin/env bash\n" + "".join(f'echo "{name}=${{{name}-unset}}"\n' for name in IFACE_VARIABLES)
    )
    fake_ray.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in IFACE_VARIABLES + ("IFNAME",)}
    base.update(PATH=f"{bin_dir}:{os.environ['PATH']}", HEAD_IP="127.0.0.1", NODE_IP="127.0.0.1", **env)
    return subprocess.run(
        ["bash", str(SCRIPT), "worker"], env=base, capture_output=True, text=True, timeout=30, check=False
    )


def test_no_interface_given_leaves_the_variables_unset(tmp_path: Path) -> None:
    done = run_worker(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "NCCL_SOCKET_IFNAME=unset" in done.stdout
    assert "GLOO_SOCKET_IFNAME=unset" in done.stdout


@pytest.mark.skipif(not Path("/sys/class/net/lo").exists(), reason="no loopback interface listed in /sys/class/net")
def test_a_given_interface_sets_both(tmp_path: Path) -> None:
    done = run_worker(tmp_path, IFNAME="lo")
    assert done.returncode == 0, done.stderr
    assert "NCCL_SOCKET_IFNAME=lo" in done.stdout
    assert "GLOO_SOCKET_IFNAME=lo" in done.stdout


@pytest.mark.skipif(not Path("/sys/class/net/lo").exists(), reason="no loopback interface listed in /sys/class/net")
def test_a_variable_set_by_the_user_wins_over_ifname(tmp_path: Path) -> None:
    done = run_worker(tmp_path, IFNAME="lo", NCCL_SOCKET_IFNAME="ib0")
    assert "NCCL_SOCKET_IFNAME=ib0" in done.stdout
    assert "GLOO_SOCKET_IFNAME=lo" in done.stdout


def test_an_interface_the_node_lacks_is_one_line(tmp_path: Path) -> None:
    done = run_worker(tmp_path, IFNAME="no-such-iface0")
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "IFNAME=no-such-iface0 is not a network interface" in lines[0]
