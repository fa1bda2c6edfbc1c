"""TreeGraft demo app (Gradio; Hugging Face Spaces style). `python app.py` serves on 127.0.0.1:7860.

Where it binds: Gradio's own GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (set by Docker images, proxies,
hosting scripts and Spaces), else the aliases TREEGRAFT_HOST / TREEGRAFT_PORT, else 0.0.0.0 on a Space
(SPACE_ID set) and 127.0.0.1 elsewhere; port 7860 by default.
"""
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")


def bind_address(env=os.environ) -> tuple[str, int]:
    """(host, port) from Gradio's variables, then TreeGraft's aliases, then 127.0.0.1:7860."""
    spaces = "0.0.0.0" if env.get("SPACE_ID") else None  # a Space's container must listen on every interface
    host = env.get("GRADIO_SERVER_NAME") or env.get("TREEGRAFT_HOST") or spaces or "127.0.0.1"
    port = env.get("GRADIO_SERVER_PORT") or env.get("TREEGRAFT_PORT") or "7860"
    try:
        return host, int(port)
    except ValueError:
        raise SystemExit(f"error: the server port must be a number, got '{port}'") from None


def main() -> None:
    from ui.app_blocks import build_app

    demo = build_app()
    demo.queue(default_concurrency_limit=1, max_size=16)
    host, port = bind_address()
    demo.launch(server_name=host, server_port=port)


if __name__ == "__main__":
    main()
