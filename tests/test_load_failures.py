"""A model that fails to load gets a clear message, through the CLI and the app, and loses nothing.

Real failures, no mocks: a pip package that is not installed, a checkpoint folder
whose config is broken, and (in a child process capped with RLIMIT_AS) a real
out-of-memory error while the weights load.
"""
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_app import free_port, submit_args
from treegraft.cli import main
from treegraft.config import DEFAULT_MODELS_YAML, REPO_ROOT

MISSING_PACKAGE = "treegraft_no_such_package"


@pytest.fixture(scope="module")
def models_yaml(tmp_path_factory):
    """The shipped models.yaml plus two pairs that cannot load."""
    tmp = tmp_path_factory.mktemp("load-failures")
    broken = tmp / "broken-checkpoint"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama", "hidden_size": ')  # cut short
    data = yaml.safe_load(Path(DEFAULT_MODELS_YAML).read_text())
    data["pairs"] = {"default": data["pairs"]["default"],
                     "missing-package": {"target": {"gguf_package": MISSING_PACKAGE, "gguf_file": "x.gguf"},
                                         "mid": {"path": "models/smollm2-mid"}},
                     "broken-checkpoint": {"target": {"path": str(broken)}, "mid": {"path": str(broken)}}}
    out = tmp / "models.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def test_cli_missing_package(models_yaml, capsys):
    assert main(["--models", str(models_yaml), "generate", "--pair", "missing-package", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert f"pip package '{MISSING_PACKAGE}' is not installed" in err and "Traceback" not in err


def test_cli_broken_checkpoint(models_yaml, capsys):
    assert main(["--models", str(models_yaml), "generate", "--pair", "broken-checkpoint", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "could not load the target tokenizer (path:" in err or "could not load the target (path:" in err, err


def test_cli_out_of_memory_while_loading(tmp_path):
    """A real allocation failure: the child process may map 512 MiB more than torch itself needs."""
    probe = subprocess.run([sys.executable, "-c", "import resource, torch, transformers; "
                            "print(int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize())"],
                           capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    limit = int(probe.stdout.strip()) + (512 << 20)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    run = subprocess.run([sys.executable, "-m", "treegraft", "generate", "--prompt", "hi", "--max-new-tokens", "2",
                          "--dtype", "float32"], capture_output=True, text=True, cwd=REPO_ROOT,
                         preexec_fn=cap, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "out of memory while loading the" in run.stderr and "Traceback" not in run.stderr


@pytest.fixture(scope="module")
def app_url(models_yaml):
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    from ui.app_blocks import build_app
    from ui.runtime import Runtime

    demo = build_app(Runtime(models_yaml))
    demo.queue(default_concurrency_limit=1, max_size=16)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def test_app_reports_load_failures_and_keeps_working(app_url):
    from gradio_client import Client

    client = Client(app_url, analytics_enabled=False, verbose=False)
    with pytest.raises(Exception, match=f"pip package {MISSING_PACKAGE} is not installed"):
        client.predict(*submit_args(pair="missing-package"), api_name="/generate")
    with pytest.raises(Exception, match="Could not load pair 'broken-checkpoint'|could not load the target"):
        client.predict(*submit_args(pair="broken-checkpoint"), api_name="/generate")
    final = client.predict(*submit_args(max_new=4, compare=False), api_name="/generate")
    assert final[0].startswith("Done.")


def test_pair_with_two_vocabularies_is_refused_naming_both(tmp_path, capsys):
    """Real checkpoints on disk: a tiny target and a tiny mid whose tokenizers map tokens differently."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.tiny import VOCAB, tiny_model, tiny_tokenizer

    target_dir, mid_dir = tmp_path / "tiny-target", tmp_path / "tiny-mid-other-vocab"
    tiny_model(1).save_pretrained(target_dir)
    tiny_tokenizer().save_pretrained(target_dir)
    tiny_model(2, layers=1).save_pretrained(mid_dir)
    other = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    other.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=other).save_pretrained(mid_dir)
    yml = tmp_path / "models.yaml"
    yml.write_text(yaml.safe_dump({"pairs": {"mismatch": {
        "target": {"path": str(target_dir)}, "mid": {"path": str(mid_dir)}, "chat_template": False,
        "dtype": "float32", "device": "cpu"}}}))
    rc = main(["--models", str(yml), "generate", "--pair", "mismatch", "--prompt", "t1 t2", "--raw"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"path:{target_dir}" in err and f"path:{mid_dir}" in err and "do not share one vocabulary" in err


@pytest.mark.parametrize("content, message", [(None, "not found"), (b"not a corpus", "is not a TreeGraft corpus")])
def test_a_missing_or_broken_corpus_is_a_clear_error(tmp_path, capsys, content, message):
    corpus = tmp_path / "corpus.npz"
    if content is not None:
        corpus.write_bytes(content)
    data = yaml.safe_load(Path(DEFAULT_MODELS_YAML).read_text())
    data["pairs"] = {"bad-corpus": {**data["pairs"]["default"], "corpus": str(corpus)}}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["--models", str(path), "generate", "--pair", "bad-corpus", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert f"corpus file {corpus}" in err and message in err and "Traceback" not in err, err
