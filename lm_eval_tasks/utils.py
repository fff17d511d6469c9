"""hellaswag_local.yaml's document processing: lm-eval's own hellaswag task's, unchanged, so that
the local task scores exactly as the harness's hellaswag does."""
from lm_eval.tasks.hellaswag import utils as hellaswag

process_docs = hellaswag.process_docs
