"""How a train state is laid out in a checkpoint: replicated leaves packed into one vector
per dtype, by one compiled call that also makes the copy an asynchronous save needs.

Orbax's CPU cost per save grows with the number of arrays: ~1.3 ms each on top of ~22 ms
(orbax-checkpoint 0.12.8, measured on CPU). An MLP's Adam state has 17 small leaves, and
written leaf by leaf, a save every 20 steps took more CPU than the 20 steps. Packing the
replicated leaves (parameters, optimizer moments, counters: most of a data-parallel state)
into one 1-D array per dtype and mesh leaves Orbax two or three arrays to write. The packing
call is compiled once per state structure (the cache is shared by all checkpointers) and
dispatched asynchronously, so the training thread spends one dispatch on it; its outputs
are new buffers, which the next step's donation of the state cannot overwrite while they
are being written.

Leaves that are sharded (ZeRO / FSDP state) or of an extended dtype (PRNG keys) are copied
as they are, and Orbax writes them shard by shard. `Layout.describe()` is stored with the
checkpoint, so `unpack` rebuilds the state in the *target's* shardings, whatever the device
count at save time.

Before anything is restored, `verify` checks a stored layout against itself (each leaf
where `of` would have put it), against the stored arrays (names, dtypes, shapes) and against
the model's state (paths, shapes, dtypes): a damaged or edited record raises
`CheckpointError` instead of loading wrong numbers.

Example:
  >>> layout = Layout.of(state)
  >>> arrays = layout.pack(jax.tree.leaves(state))   # {"p0": vector, "l7": leaf, ...}
  >>> stored = orbax_restore(layout.abstract(state))  # the arrays, placed as `state`'s
  >>> restored = layout.unpack(stored, state)
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from phalanx._src.train.checkpoint.record import CheckpointError

Place = tuple[str, int]  # (array name, offset): "p<k>" a packed vector, "l<i>" leaf i as is


def _replicated(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """A replicated sharding of any rank on the devices of `sharding` (a mesh or one
    device)."""
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec())
    if isinstance(sharding, SingleDeviceSharding):
        return sharding
    raise TypeError(f"checkpoints need NamedSharding or SingleDeviceSharding, got {sharding}")


def _packable(leaf: Any) -> bool:
    return (
        not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended)
        and isinstance(leaf.sharding, NamedSharding | SingleDeviceSharding)
        and leaf.sharding.is_fully_replicated
    )


@functools.lru_cache(maxsize=16)  # shared by all checkpointers: compiled once per structure
def _packer(places: tuple[Place, ...], shardings: tuple[tuple[str, Any], ...]) -> Any:
    def pack(leaves: list[jax.Array]) -> dict[str, jax.Array]:
        parts: dict[str, list[jax.Array]] = {}
        for (name, _), leaf in zip(places, leaves, strict=True):
            parts.setdefault(name, []).append(leaf)
        return {
            # A copy, never the input itself: the next step donates the input's buffer.
            name: jnp.concatenate([p.ravel() for p in ps]) if name[0] == "p" else jnp.copy(ps[0])
            for name, ps in parts.items()
        }

    return jax.jit(pack, out_shardings=dict(shardings))


class Layout:
    """Where each leaf of a state goes in a checkpoint.

    Args:
      paths: every leaf's key path (`jax.tree_util.keystr`), in flattening order.
      shapes: every leaf's shape.
      dtypes: every leaf's dtype name.
      places: per leaf, `("p<k>", offset)` when packed into vector `p<k>` at `offset`, or
        `("l<i>", 0)` for leaf i written as it is.

    A layout made by `of` packs; one read back by `from_description` restores.
    """

    def __init__(
        self,
        paths: list[str],
        shapes: list[tuple[int, ...]],
        dtypes: list[str],
        places: tuple[Place, ...],
    ) -> None:
        self.paths = paths
        self.shapes = shapes
        self.dtypes = dtypes
        self.places = places
        self._pack: Any = None

    @classmethod
    def of(cls, state: Any) -> Layout:
        """The layout for saving `state` (a pytree of `jax.Array`s)."""
        with_paths, _ = jax.tree_util.tree_flatten_with_path(state)
        groups: dict[tuple[Any, Any], list[Any]] = {}  # (dtype, sharding) -> [name, size]
        places: list[Place] = []
        shardings: dict[str, Any] = {}
        for index, (_, leaf) in enumerate(with_paths):
            if not _packable(leaf):
                places.append((f"l{index}", 0))
                shardings[f"l{index}"] = leaf.sharding
                continue
            sharding = _replicated(leaf.sharding)
            group = groups.setdefault((np.dtype(leaf.dtype), sharding), [f"p{len(groups)}", 0])
            places.append((group[0], group[1]))
            shardings.setdefault(group[0], sharding)
            group[1] += math.prod(leaf.shape)
        layout = cls(
            [jax.tree_util.keystr(path) for path, _ in with_paths],
            [tuple(leaf.shape) for _, leaf in with_paths],
            [str(leaf.dtype) for _, leaf in with_paths],
            tuple(places),
        )
        layout._pack = _packer(layout.places, tuple(shardings.items()))
        return layout

    def pack(self, leaves: list[jax.Array]) -> dict[str, jax.Array]:
        """The arrays to write, as new device buffers: the packed vectors and copies of the
        other leaves (one compiled call). All processes must call it with matching leaves:
        the arrays may span processes."""
        return self._pack(leaves)

    def describe(self) -> dict[str, Any]:
        """The layout as JSON values, stored beside the checkpoint."""
        return {
            "paths": self.paths,
            "shapes": [list(shape) for shape in self.shapes],
            "dtypes": self.dtypes,
            "places": [list(place) for place in self.places],
        }

    @classmethod
    def from_description(cls, description: Any, source: str = "the checkpoint") -> Layout:
        """The layout `describe` wrote, read back from `source` (named in errors).

        Raises:
          CheckpointError: when the description is damaged.
        """
        try:
            paths = list(description["paths"])
            shapes = [tuple(shape) for shape in description["shapes"]]
            dtypes = list(description["dtypes"])
            places = tuple((name, offset) for name, offset in description["places"])
            fine = (
                len(paths) == len(shapes) == len(dtypes) == len(places)
                and all(isinstance(p, str) for p in paths + dtypes)
                and all(type(n) is int and n >= 0 for shape in shapes for n in shape)
                and all(isinstance(name, str) and type(at) is int for name, at in places)
            )
        except (TypeError, KeyError, ValueError):
            fine = False
        if not fine:
            raise CheckpointError(
                f"the layout stored in {source} is damaged (expected lists of paths, shapes, "
                "dtypes and places of one length): restore another checkpoint, or delete it"
            )
        return cls(paths, shapes, dtypes, places)

    def verify(
        self,
        target: Any,
        source: str,
        stored: dict[str, tuple[tuple[int, ...], Any]] | None = None,
        keys: Any = None,
    ) -> None:
        """Checks, before anything is restored, that this stored layout is one `of` makes,
        that it fits `target` (a state of the model restoring it), and, when given, that the
        `stored` arrays (name -> (shape, dtype)) and PRNG `keys` (name -> implementation)
        are the ones it places.

        Raises:
          CheckpointError: naming `source` and what differs.
        """
        leaves = self._check(target, source)
        vectors = self._vectors(source)
        if stored is None:
            return
        names = set(vectors) | {name for name, _ in self.places if name[0] == "l"}
        key_leaves = {f"l{i}" for i, leaf in enumerate(leaves) if _is_key(leaf.dtype)}
        if set(stored) != names or not isinstance(keys, dict) or set(keys) != key_leaves:
            raise CheckpointError(
                f"{source} holds arrays {sorted(stored)} (PRNG keys: "
                f"{sorted(keys) if isinstance(keys, dict) else keys!r}), but its layout places "
                f"leaves in {sorted(names)} (keys: {sorted(key_leaves)}): the record is damaged "
                "or was edited; restore another checkpoint, or delete this one"
            )
        wanted = {name: ((size,), jnp.dtype(dtype)) for name, (size, dtype) in vectors.items()}
        for index, (name, _) in enumerate(self.places):
            if name[0] == "p":
                continue
            leaf = leaves[index]
            if name in keys:
                impl = str(jax.random.key_impl(leaf))
                if keys[name] != impl:
                    raise CheckpointError(
                        f"{source}: the PRNG key {self.paths[index]} is stored as "
                        f"{keys[name]!r}, the model's is {impl!r}; restore into a model that "
                        "uses the same random number generator"
                    )
                leaf = jax.eval_shape(jax.random.key_data, leaf)
            wanted[name] = (tuple(leaf.shape), leaf.dtype)
        for name, (shape, dtype) in wanted.items():
            got_shape, got_dtype = stored[name]
            if tuple(got_shape) != shape or jnp.dtype(got_dtype) != dtype:
                raise CheckpointError(
                    f"{source}: array {name!r} is stored as {jnp.dtype(got_dtype).name}"
                    f"{list(got_shape)}, but the layout and the model want "
                    f"{jnp.dtype(dtype).name}{list(shape)}: the record is damaged or was "
                    "edited; restore another checkpoint, or delete this one"
                )

    def _vectors(self, source: str) -> dict[str, tuple[int, str]]:
        """Each packed vector's size and dtype; raises unless every leaf is where `of`
        would have put it (vectors numbered in order of first use, leaves back to back)."""
        vectors: dict[str, tuple[int, str]] = {}
        for index, ((name, at), shape, dtype) in enumerate(
            zip(self.places, self.shapes, self.dtypes, strict=True)
        ):
            if name == f"l{index}" and at == 0:
                continue
            size, vector_dtype = vectors.get(name, (0, dtype))
            known = name in vectors or name == f"p{len(vectors)}"
            if not (known and at == size and dtype == vector_dtype and _plain(dtype)):
                raise CheckpointError(
                    f"the layout stored in {source} is damaged: leaf {self.paths[index]} "
                    f"({dtype}{list(shape)}) is placed at {name}[{at}], where no save puts it; "
                    "restore another checkpoint, or delete this one"
                )
            vectors[name] = (at + math.prod(shape), dtype)
        return vectors

    def abstract(self, target: Any) -> dict[str, jax.ShapeDtypeStruct]:
        """The stored arrays' shapes, placed for restoring into `target` (a state of the
        saved structure, in the shardings wanted). Packed vectors are read in their stored
        dtype; `unpack` casts each leaf to its target's, as Orbax does for whole leaves.

        Raises:
          CheckpointError: (a ValueError) when `target`'s leaves differ from the stored ones.
        """
        out: dict[str, jax.ShapeDtypeStruct] = {}
        vectors: dict[str, list[Any]] = {}  # name -> [size, dtype, replicated sharding]
        leaves = self._check(target)
        for (name, offset), leaf, dtype in zip(self.places, leaves, self.dtypes, strict=True):
            if name[0] == "l":
                out[name] = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
                continue
            vector = vectors.setdefault(name, [0, jnp.dtype(dtype), _replicated(leaf.sharding)])
            vector[0] = max(vector[0], offset + math.prod(leaf.shape))
        for name, (size, dtype, sharding) in vectors.items():
            out[name] = jax.ShapeDtypeStruct((size,), dtype, sharding=sharding)
        return out

    def unpack(self, arrays: dict[str, jax.Array], target: Any) -> Any:
        """A state of `target`'s structure and shardings holding the stored `arrays`."""
        leaves, treedef = jax.tree.flatten(target)
        places = self.places

        def unpack(arrays: dict[str, jax.Array]) -> list[jax.Array]:
            out = []
            for (name, offset), leaf in zip(places, leaves, strict=True):
                if name[0] == "p":
                    size = math.prod(leaf.shape)
                    part = arrays[name][offset : offset + size].reshape(leaf.shape)
                    out.append(part.astype(leaf.dtype))
                else:
                    out.append(arrays[name])
            return out

        shardings = [leaf.sharding for leaf in leaves]
        return jax.tree.unflatten(treedef, jax.jit(unpack, out_shardings=shardings)(arrays))

    def _check(self, target: Any, source: str = "") -> list[Any]:
        with_paths, _ = jax.tree_util.tree_flatten_with_path(target)
        paths = [jax.tree_util.keystr(path) for path, _ in with_paths]
        shapes = [tuple(leaf.shape) for _, leaf in with_paths]
        dtypes = [str(leaf.dtype) for _, leaf in with_paths]
        read = f" (read from {source})" if source else ""
        if paths == self.paths and shapes == self.shapes and dtypes != self.dtypes:
            differ = [
                f"{path}: {stored} vs {wanted}"
                for path, stored, wanted in zip(paths, self.dtypes, dtypes, strict=True)
                if stored != wanted
            ]
            raise CheckpointError(
                f"the checkpoint does not fit this model's state{read}: {len(differ)} leaves "
                f"differ in dtype (path: stored dtype vs model dtype), e.g. "
                f"{', '.join(differ[:4])}; restore into a model compiled with the same "
                "optimizer and precision policy as the one saved"
            )
        if paths != self.paths or shapes != self.shapes:
            stored = dict(zip(self.paths, self.shapes, strict=True))
            wanted = dict(zip(paths, shapes, strict=True))
            differ = sorted(
                k for k in stored.keys() | wanted.keys() if stored.get(k) != wanted.get(k)
            )
            examples = ", ".join(f"{k}: {stored.get(k)} vs {wanted.get(k)}" for k in differ[:4])
            raise CheckpointError(
                f"the checkpoint does not fit this model's state{read}: {len(differ)} leaves "
                f"differ (path: stored shape vs model shape), e.g. {examples}; restore into a "
                "model built and compiled like the one that was saved"
            )
        return [leaf for _, leaf in with_paths]


def _is_key(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _plain(dtype: str) -> bool:
    """Whether `dtype` names a dtype that packs into a vector (not a PRNG key)."""
    try:
        return not jax.dtypes.issubdtype(jnp.dtype(dtype), jax.dtypes.extended)
    except Exception:  # a damaged record may name anything
        return False
