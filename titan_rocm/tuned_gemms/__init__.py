"""What training reads of ``titan-rocm tune``'s results (the tuner is ``titan_rocm.tuner``).

Only :mod:`.choices` imports torch. Docs: docs/validated-tuning.md.
"""
