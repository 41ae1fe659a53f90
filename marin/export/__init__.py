"""Export: marin's model as a Hugging Face Llama checkpoint (:mod:`marin.export.hf`, without
torch or transformers), and the export stage (:mod:`marin.export.export_stage`)."""
