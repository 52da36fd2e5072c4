"""Engine store implementations behind :class:`trtforge.store.base.EngineStore`.

`open_store(uri)` picks one.
"""
