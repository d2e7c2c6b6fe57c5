"""The persistent compilation cache: on in a chosen directory, off with one setting."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import phalanx
from phalanx._src import compilation_cache


def test_compiled_steps_are_written_to_the_chosen_directory(tmp_path, no_compilation_cache):
    phalanx.set_compilation_cache(tmp_path / "cache")
    jax.jit(lambda x: jnp.sin(x) * 3.25)(jnp.ones(3)).block_until_ready()
    assert any((tmp_path / "cache").iterdir())


def test_off_writes_nothing(tmp_path, no_compilation_cache):
    phalanx.set_compilation_cache(tmp_path / "cache")
    phalanx.set_compilation_cache(None)
    jax.jit(lambda x: jnp.cos(x) * 4.5)(jnp.ones(3)).block_until_ready()
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    assert not jax.config.jax_enable_compilation_cache


@pytest.mark.parametrize("setting", ["0", "off", "False", ""])
def test_environment_turns_it_off(monkeypatch, setting, no_compilation_cache):
    monkeypatch.setenv(compilation_cache.ENV, setting)
    compilation_cache.configure_from_environment()
    assert not jax.config.jax_enable_compilation_cache


def test_environment_names_the_directory(monkeypatch, tmp_path, no_compilation_cache):
    monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "c"))
    compilation_cache.configure_from_environment()
    assert jax.config.jax_enable_compilation_cache
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c")


def test_default_directory_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compilation_cache.default_directory() == tmp_path / "phalanx" / "jax"


def test_a_file_is_not_a_cache_directory(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        phalanx.set_compilation_cache(path)


def test_an_uncreatable_directory_is_refused_by_name(tmp_path, no_compilation_cache):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"'.*file/cache' cannot be created") as info:
        phalanx.set_compilation_cache(blocker / "cache")
    assert f"{compilation_cache.ENV}=0" in str(info.value)


def test_import_falls_back_to_no_cache_with_one_warning(
    no_compilation_cache, monkeypatch, tmp_path
):  # no_compilation_cache first: it turns the tests' cache back on after mkdir is restored
    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(compilation_cache.Path, "mkdir", denied)
    monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / "c"))
    with pytest.warns(RuntimeWarning, match=r"without a persistent compilation cache") as caught:
        compilation_cache.configure_from_environment()  # what `import phalanx` runs
    assert len(caught) == 1
    assert "PermissionError: Permission denied" in str(caught[0].message)
    assert str(tmp_path / "c") in str(caught[0].message)
    assert not jax.config.jax_enable_compilation_cache
    jax.jit(lambda x: x * 5.5)(jnp.ones(3)).block_until_ready()  # compiles without a cache


@pytest.mark.slow
def test_import_phalanx_succeeds_when_the_default_cache_cannot_be_made(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    env = {k: v for k, v in os.environ.items() if k != compilation_cache.ENV}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["XDG_CACHE_HOME"] = str(blocker)  # the default cache folder cannot be created
    done = subprocess.run(
        [sys.executable, "-c", "import phalanx; print('imported')"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "imported" in done.stdout
    assert done.stderr.count("without a persistent compilation cache") == 1, done.stderr[-2000:]
    assert "not-a-folder/phalanx/jax" in done.stderr
