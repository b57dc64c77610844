"""The trace simulator alone: replays deadline policies on real traces
(``spot-pipelines simulate``)."""
