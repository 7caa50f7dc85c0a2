"""The steps that give a region's holder its GPU alone, each on its own: the gate that holds new
KREX jobs back (``gate``), the drain of GPU work already queued (``drain``), the freeze of sibling
sessions (``freeze``, ``cgroups``), and the cores set aside for the holder (``isolate``, ``shield``,
``corelock``). The arbiter runs them in order (``krex_lab.arbiter.enforcement``, ``scheduler``)."""
