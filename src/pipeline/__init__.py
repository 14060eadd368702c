"""pipeline: config-driven PyTorch experiments. From Python: `pipeline.run(...)` trains, `pipeline.load(run dir)`
gives a trained agent or model (docs/python_api.md). Importing this package imports neither torch nor Lightning:
the command line's start-up checks answer before those load."""

__all__ = ["Agent", "TrainedModel", "load", "run"]


def __getattr__(name: str):
    if name in __all__:
        from pipeline import api

        return getattr(api, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What tab completion offers: the API (loaded on first use, so not yet among the module's globals)."""
    return sorted({*globals(), *__all__})
