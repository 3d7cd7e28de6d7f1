"""The errors configuration raises: light (no pydantic, no schema), so that the stage runner can
catch them without loading, and depending on, every section's code."""


class ParamsError(ValueError):
    """A value in params.yaml is missing, unknown or invalid; the message is one line naming the key."""


class TuneReportMissing(ParamsError):
    """``evaluate`` leaves a decoding setting to the tune stage, which has not run yet (no report
    file). A caller may fall back to the paper's settings, saying so; a report that exists but holds
    no valid choice is a plain ``ParamsError``."""
