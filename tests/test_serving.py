"""`python app.py` binds where Gradio's own variables say (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT), with
TreeGraft's aliases behind them; checked on a real process over loopback."""
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from app import bind_address
from tests.test_app import free_port

ROOT = Path(__file__).resolve().parent.parent


def test_bind_address_precedence():
    assert bind_address({}) == ("127.0.0.1", 7860)
    assert bind_address({"TREEGRAFT_HOST": "127.0.0.3", "TREEGRAFT_PORT": "9000"}) == ("127.0.0.3", 9000)
    both = {"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861", "TREEGRAFT_HOST": "x", "TREEGRAFT_PORT": "1"}
    assert bind_address(both) == ("0.0.0.0", 7861)
    assert bind_address({"SPACE_ID": "user/treegraft"}) == ("0.0.0.0", 7860)


def test_app_serves_where_gradio_variables_say():
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.2", "GRADIO_SERVER_PORT": str(port),
           "TREEGRAFT_HOST": "127.0.0.1", "TREEGRAFT_PORT": "7860", "NO_PROXY": "*"}
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline, status = time.time() + 120, None
        while time.time() < deadline and status is None:
            try:
                status = urllib.request.urlopen(f"http://127.0.0.2:{port}/", timeout=5).status
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
                time.sleep(1)
        assert status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
