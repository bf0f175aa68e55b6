"""The daemon: its wiring from one ``Settings`` object, and running it.

``plan`` decides how variants are served (router presets or per-request fields) and
builds the engine's ingredients; ``capacity`` sizes how many instances fit in memory;
``serve`` wires everything together and runs it under uvicorn.
"""
