"""Everything a served translation passes through: the decoding settings (``decoding``), the translator
(``translator``: the averaged model, its tokenizer and beam search, §6.1), the MLflow pyfunc model
(``mlflow_model``; logged and registered by ``pipeline.pyfunc``), the export to
CTranslate2 (``export``), the translate command (``translate``) and the HTTP server of the
registered model (``mlflow_server``).

Imports nothing, so that ``pipeline.config.params`` can load ``decoding`` alone.
"""
