"""Feeding: a batch's way from the user's data to a compiled call's input.

- `sources`: Keras's inputs as host batches; in-memory data kept on the devices
  (`device_data`), so that only row numbers cross from the host; its in-order batches
  placed once and read inside the calls at a device cursor (`blocks`), reused by the next
  call when safe (`reuse`).
- `batches.Groups`: a host iterator's batches, K at a time (one call's worth).
- `feeders`: the `Feeder` protocol and its two feeders, `HostFeeder` (host batches, ahead
  in a thread) and `ResidentFeeder` (device-resident data, a fill at a time in the loop's
  thread).
- `dispatch.Runner`: turns groups into call inputs (`inputs`: a batch, a `Table` entry,
  `Resident` blocks, or `Cycled` calls on data in order) and binds them to the engine's
  compiled calls; with `steps_per_execution='auto'` the first training calls time a scan
  against single calls (`trial`).

May import: `engine`, `api`, and the data and strategy layers; not `loops`, `checkpoint`
or `model.py`.
"""
