//! Fuzz targets live in `tests/` (bolero): see docs/reliability.md.
