"""Everything a served translation passes through: what a request and the evaluate stage decode with
(``decoding``, from the settings ``pipeline.config.decoding`` defines; a registered version's,
``registered``), the translators (``translator``: the averaged model, its tokenizer and beam search,
§6.1; ``ct2_translator``; ``engine`` builds the one a setting names), the MLflow pyfunc model class
(``mlflow_model``; logged and registered by ``pipeline.pyfunc``), the export to CTranslate2
(``export``), the translate command (``translate``), our HTTP server (``server/``) and MLflow's
(``mlflow_server``).

Imports nothing, so that importing one of its modules loads only that module's own imports.
"""
