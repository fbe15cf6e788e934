"""Stage 4b, publishing to the Hugging Face Hub: the upload (`upload`) and the model card it carries (`card`)."""
