"""The stages' records as senders of plain data (``send(data, files, progress)``), one module per
stage: the later stages' (average, tune; evaluate's, which registers the model, is
``pipeline.pyfunc.evaluate_record``), run now by the stage, or later from the unsent
queue by ``pipeline.tracking.unsent.deferred``; and the training's (``train``), queued only by a training
that found no run to log into. Each raises whatever the store raises, so that a record the server
did not take waits; ``progress`` keeps what a sender already did (its run, its registered version)
for the next try. ``links(data)`` names the sha256s a record needs found on the server and those
it links there: a record set aside holds back the later ones that need what it links."""
