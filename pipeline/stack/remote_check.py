"""One signed question to the DVC remote's S3 store before ``make push`` / ``make pull`` (and after a
failed one): do the keys in the environment open its bucket? So that a refusal (403: wrong or
missing keys) and a store that does not answer each get one line that says which it was, instead
of DVC's error per file and a "run it again" that cannot help."""

from __future__ import annotations

import os
from urllib.parse import urlparse

KEY_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def remote_problem(url: str, endpoint: str) -> str | None:
    """What is wrong with reaching ``url`` (``s3://bucket/prefix``) at ``endpoint`` with this
    environment's keys, in words, or None when the store lets them in."""
    import boto3  # the stack's own requirements
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    bucket = urlparse(url).netloc
    missing = [name for name in KEY_VARIABLES if not os.environ.get(name)]
    config = Config(connect_timeout=3, read_timeout=10, retries={"max_attempts": 1},
                    **({"signature_version": UNSIGNED} if missing else {}))
    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    s3 = boto3.client("s3", endpoint_url=endpoint or None, region_name=region, config=config)
    try:
        s3.head_bucket(Bucket=bucket)
        return None
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code", "")
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        answer = f"the S3 store answered {status}{f' {code}' if code and code != str(status) else ''}"
        if missing:
            return f"{answer} to a request without keys ({' and '.join(missing)} not set: source the stack's env file)"
        if status in (401, 403):
            return (f"{answer}: it refuses the keys in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (source the "
                    f"stack's env file, or ask for this machine's keys)")
        return f"{answer} for bucket {bucket!r}"
    except BotoCoreError as err:
        return f"the S3 store at {endpoint} is unreachable ({type(err).__name__}: {str(err)[:160]})"
