"""The Gradio app: a thin shell over pure figure builders and the engine's traces."""
