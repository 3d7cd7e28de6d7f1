"""Configuration: ``params.yaml`` read into typed, validated models (``params``) and where the
stages read and write (``paths``). Imports nothing itself, so that a module needing only the paths
does not load, and depend on, the schema."""
