"""Coverage-guided fuzzing (atheris) of the parsers this product wrote itself: see docs/fuzzing.md.

Not part of the product and not collected by pytest: `python -m fuzz.run` runs the harnesses
(`fuzz/fuzz_*.py`); tests/test_fuzz_smoke.py runs each briefly with a fixed seed.
"""
