"""The translator's pyfunc model as code (MLflow's "models from code"): ``log_translator`` logs this
file as the model, and ``mlflow.pyfunc.load_model`` (and ``mlflow models serve``) runs it, with the
version's code folder first on ``sys.path``, to get the model object, instead of unpickling a
``TranslatorModel`` saved with cloudpickle: loading a version executes no pickled code, and a
version loads under any cloudpickle and Python version that can import its code. The model's state
(weights, tokenizer, the CTranslate2 export, the decoding settings) is all in its artifacts and
``model_config``, read by ``TranslatorModel.load_context``.

Importing it has one effect: MLflow's current model (``mlflow.models.set_model``) becomes a new,
unloaded ``TranslatorModel``, what MLflow itself does when it logs or loads the file.
"""

import mlflow

from pipeline.serving.mlflow_model import TranslatorModel

mlflow.models.set_model(TranslatorModel())
