"""TreeGraft demo app (Gradio; Hugging Face Spaces style). `python app.py` serves on 127.0.0.1:7860."""
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")


def main() -> None:
    from ui.app_blocks import build_app

    demo = build_app()
    demo.queue(default_concurrency_limit=1, max_size=16)
    on_spaces = bool(os.environ.get("SPACE_ID"))
    host = None if on_spaces else os.environ.get("TREEGRAFT_HOST", "127.0.0.1")
    port = None if on_spaces else int(os.environ.get("TREEGRAFT_PORT", "7860"))
    demo.launch(server_name=host, server_port=port)


if __name__ == "__main__":
    main()
