"""What training reads of ``titan-rocm tune``'s results (docs/validated-tuning.md); only
:mod:`.choices` imports torch."""
