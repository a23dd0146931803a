"""vLLM's logging config as a test process sets it up (a script's first lines)."""

# The shape of vLLM's own config (vllm/logger.py): its 'vllm' logger, propagate off, existing
# loggers kept.
VLLM_LOGGING = """
import json, logging, logging.config, os, sys
logging.config.dictConfig({
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"vllm": {"format": "%(levelname)s %(message)s"}},
    "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm",
                          "stream": "ext://sys.stdout"}},
    "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False}},
})
"""
