"""Fixtures of the phalanx.image tests."""

from __future__ import annotations

import pytest

from phalanx._src.image import opencv


@pytest.fixture(params=["opencv", "numpy"])
def backend(request, monkeypatch):
    """phalanx.image's OpenCV paths (where installed: the fused crop-resize-flip and the
    bilinear `resize`), then the NumPy fallbacks they replace."""
    if request.param == "opencv":
        pytest.importorskip("cv2", reason="OpenCV is phalanx's `image` extra")
    else:
        monkeypatch.setattr(opencv, "_cv2", None)
    return request.param
