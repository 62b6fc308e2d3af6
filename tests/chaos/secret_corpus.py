"""Secret shapes the redactor must catch, and innocent text it must leave alone.

`SECRETS` is a list of (name, text, secret): `text` is how the secret shows up in an agent's
trace (a header, an env dump, JSON, a config file), `secret` the part that must never reach
disk. The shapes follow the rule sets of gitleaks and detect-secrets. Every value is fake: made
here from a seeded generator with the right alphabet and length, so that no real-looking key
sits in the repository's source for scanners to flag.

`INNOCENT` is text that looks a little like a secret (ids, hashes in git context, UUIDs, token
counts, prose about passwords) and must come out unchanged.
"""

from __future__ import annotations

import base64
import random
import string

_rng = random.Random(1313)
ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"


def fake(n: int, alphabet: str = ALNUM) -> str:
    """`n` random characters of `alphabet` (deterministic: the corpus is the same every run)."""
    return "".join(_rng.choice(alphabet) for _ in range(n))


def aws_secret() -> str:
    """40 base64 characters with an upper-case letter and a digit, as AWS makes them."""
    return fake(18, B64) + "A7/" + fake(19, B64)


def jwt() -> str:
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=").decode()
    payload = base64.urlsafe_b64encode(b'{"sub":"1234567890","name":"Jo"}').rstrip(b"=")
    return f"{header}.{payload.decode()}.{fake(43, URLSAFE)}"


def pem(kind: str = "RSA PRIVATE KEY", lines: int = 25) -> tuple[str, str]:
    """A PEM block and one line of its body (the needle a test looks for)."""
    body = [fake(64, B64) for _ in range(lines)]
    return f"-----BEGIN {kind}-----\n" + "\n".join(body) + f"\n-----END {kind}-----", body[3]


SK_ANT = "sk-ant-api03-" + fake(93, URLSAFE) + "AA"
SK_PROJ = "sk-proj-" + fake(48, URLSAFE)
SK_SVC = "sk-svcacct-" + fake(40, URLSAFE)
AKIA = "AKIA" + fake(16, UPPER_DIGITS)
ASIA = "ASIA" + fake(16, UPPER_DIGITS)
AWS_SECRETS = [aws_secret() for _ in range(4)]
GHP = "ghp_" + fake(36)
GHO = "gho_" + fake(36)
GHS = "ghs_" + fake(36)
GITHUB_PAT = "github_pat_" + fake(22) + "_" + fake(59)
GLPAT = "glpat-" + fake(20, URLSAFE)
GLRT = "glrt-" + fake(20, URLSAFE)
SLACK_BOT = f"xoxb-{fake(11, string.digits)}-{fake(12, string.digits)}-{fake(24)}"
SLACK_USER = f"xoxp-{fake(11, string.digits)}-{fake(12, string.digits)}-{fake(32, HEX)}"
SLACK_APP = f"xapp-1-A{fake(10, UPPER_DIGITS)}-{fake(13, string.digits)}-{fake(64, HEX)}"
SLACK_HOOK = f"T{fake(8, UPPER_DIGITS)}/B{fake(10, UPPER_DIGITS)}/{fake(24)}"
STRIPE_LIVE = "sk_live_" + fake(24)
STRIPE_RESTRICTED = "rk_live_" + fake(24)
STRIPE_TEST = "sk_test_" + fake(24)
STRIPE_WEBHOOK = "whsec_" + fake(32)
GOOGLE_KEY = "AIza" + fake(35, URLSAFE)
GOOGLE_OAUTH = "GOCSPX-" + fake(28, URLSAFE)
GOOGLE_ACCESS = "ya29." + fake(60, URLSAFE)
AZURE_ACCOUNT_KEY = fake(86, B64) + "=="
AZURE_SB_KEY = fake(43, B64) + "="
AZURE_AD = fake(3, ALNUM) + "8Q~" + fake(34, ALNUM + "_~.")
AZURE_SIG = fake(43, ALNUM) + "%3D"
TWILIO = "SK" + fake(32, HEX)
TWILIO_TOKEN = fake(32, HEX)
SENDGRID = f"SG.{fake(22, URLSAFE)}.{fake(43, URLSAFE)}"
NPM = "npm_" + fake(36)
PYPI = "pypi-AgEIcHlwaS5vcmc" + fake(70, URLSAFE)
HF = "hf_" + fake(34, string.ascii_letters)
GROQ = "gsk_" + fake(52)
JWT = jwt()
PEM_RSA, PEM_RSA_LINE = pem("RSA PRIVATE KEY")
PEM_EC, PEM_EC_LINE = pem("EC PRIVATE KEY", 5)
PEM_PKCS8, PEM_PKCS8_LINE = pem("PRIVATE KEY", 26)
PEM_ENCRYPTED, PEM_ENCRYPTED_LINE = pem("ENCRYPTED PRIVATE KEY", 27)
PEM_OPENSSH, PEM_OPENSSH_LINE = pem("OPENSSH PRIVATE KEY", 7)
PEM_PGP, PEM_PGP_LINE = pem("PGP PRIVATE KEY BLOCK", 30)
PASSWORDS = [fake(16) + "!x" for _ in range(12)]
BASIC = base64.b64encode(b"admin:" + fake(16).encode()).decode()

SECRETS: list[tuple[str, str, str]] = [
    ("anthropic", f"client = Anthropic(api_key='{SK_ANT}')", SK_ANT),
    ("openai", f"using {SK_PROJ} for this call", SK_PROJ),
    ("openai-service-account", f"OPENAI key {SK_SVC}", SK_SVC),
    ("aws-access-key-id", f"aws_access_key_id = {AKIA}", AKIA),
    ("aws-sts-key-id", f"temporary credentials {ASIA} expire at noon", ASIA),
    ("aws-secret-env", f"AWS_SECRET_ACCESS_KEY={AWS_SECRETS[0]}", AWS_SECRETS[0]),
    ("aws-secret-ini", f"[default]\naws_secret_access_key = {AWS_SECRETS[1]}\n", AWS_SECRETS[1]),
    (
        "aws-secret-json",
        f'{{"AccessKeyId": "{ASIA}", "SecretAccessKey": "{AWS_SECRETS[2]}"}}',
        AWS_SECRETS[2],
    ),
    (
        "aws-secret-bare",
        f"the aws credentials are {AKIA} {AWS_SECRETS[3]} (rotate)",
        AWS_SECRETS[3],
    ),
    ("github-pat", f"git clone https://github.com/o/r.git with token {GHP}", GHP),
    ("github-oauth", f"Authorization: token {GHO}", GHO),
    ("github-app", f"installation token {GHS}", GHS),
    ("github-fine-grained", f"GH={GITHUB_PAT}", GITHUB_PAT),
    ("gitlab-pat", f"curl --header 'PRIVATE-TOKEN: {GLPAT}' https://gitlab.com/api", GLPAT),
    ("gitlab-runner", f"runner registered with {GLRT}", GLRT),
    ("slack-bot", f"slack_client = WebClient({SLACK_BOT!r})", SLACK_BOT),
    ("slack-user", f"user token {SLACK_USER}", SLACK_USER),
    ("slack-app", f"app-level token {SLACK_APP}", SLACK_APP),
    ("slack-webhook", f"POST https://hooks.slack.com/services/{SLACK_HOOK}", SLACK_HOOK),
    ("stripe-live", f"stripe.api_key = {STRIPE_LIVE!r}", STRIPE_LIVE),
    ("stripe-restricted", f"restricted key {STRIPE_RESTRICTED} for reporting", STRIPE_RESTRICTED),
    ("stripe-test", f"test mode {STRIPE_TEST}", STRIPE_TEST),
    ("stripe-webhook", f"endpoint secret {STRIPE_WEBHOOK}", STRIPE_WEBHOOK),
    (
        "google-api-key",
        f"https://maps.googleapis.com/maps/api/geocode/json?key={GOOGLE_KEY}",
        GOOGLE_KEY,
    ),
    ("google-oauth-secret", f'{{"web": {{"client_secret": "{GOOGLE_OAUTH}"}}}}', GOOGLE_OAUTH),
    ("google-access-token", f"access token {GOOGLE_ACCESS}", GOOGLE_ACCESS),
    (
        "azure-storage",
        "DefaultEndpointsProtocol=https;AccountName=shop;"
        f"AccountKey={AZURE_ACCOUNT_KEY};EndpointSuffix=core.windows.net",
        AZURE_ACCOUNT_KEY,
    ),
    (
        "azure-service-bus",
        "Endpoint=sb://shop.servicebus.windows.net/;SharedAccessKeyName=Root;"
        f"SharedAccessKey={AZURE_SB_KEY}",
        AZURE_SB_KEY,
    ),
    ("azure-ad-client-secret", f"client secret value {AZURE_AD} copied from the portal", AZURE_AD),
    (
        "azure-sas",
        f"https://shop.blob.core.windows.net/c/b.txt?sv=2022-11-02&sp=r&sig={AZURE_SIG}",
        AZURE_SIG,
    ),
    ("twilio-api-key", f"twilio key {TWILIO}", TWILIO),
    ("twilio-auth-token", f"TWILIO_AUTH_TOKEN={TWILIO_TOKEN}", TWILIO_TOKEN),
    ("sendgrid", f"sg = SendGridAPIClient('{SENDGRID}')", SENDGRID),
    ("npm", f"//registry.npmjs.org/:_authToken={NPM}", NPM),
    ("npm-bare", f"npm token {NPM} created", NPM),
    ("pypi", f"[pypi]\n  username = __token__\n  password = {PYPI}\n", PYPI),
    ("pypi-bare", f"twine upload -p {PYPI}", PYPI),
    ("huggingface", f"huggingface-cli login --token {HF}", HF),
    ("huggingface-bare", f"loaded with {HF}", HF),
    ("groq", f"GROQ key {GROQ}", GROQ),
    ("jwt", f"session cookie {JWT}", JWT),
    ("bearer", f"Authorization: Bearer {JWT}", JWT),
    ("basic-auth-header", f"Authorization: Basic {BASIC}", BASIC),
    ("pem-rsa", f"key file:\n{PEM_RSA}\n", PEM_RSA_LINE),
    ("pem-ec", PEM_EC, PEM_EC_LINE),
    (
        "pem-pkcs8-json",
        f'{{"type": "service_account", "private_key": {PEM_PKCS8!r}}}',
        PEM_PKCS8_LINE,
    ),
    ("pem-encrypted", PEM_ENCRYPTED, PEM_ENCRYPTED_LINE),
    ("pem-openssh", f"~/.ssh/id_ed25519:\n{PEM_OPENSSH}", PEM_OPENSSH_LINE),
    ("pem-pgp", PEM_PGP, PEM_PGP_LINE),
    ("url-basic-auth", f"postgres://app:{PASSWORDS[0]}@db.internal:5432/shop", PASSWORDS[0]),
    ("url-basic-auth-https", f"https://deploy:{PASSWORDS[1]}@git.example.com/r.git", PASSWORDS[1]),
    ("env-db-password", f"export DB_PASSWORD={PASSWORDS[2]}", PASSWORDS[2]),
    ("env-quoted", f'export REDIS_PASSWORD="{PASSWORDS[3]}"', PASSWORDS[3]),
    ("env-github-token", f"GITHUB_TOKEN={PASSWORDS[4]} make release", PASSWORDS[4]),
    ("env-secret-in-name", f"SECRET_KEY_BASE={PASSWORDS[5]}", PASSWORDS[5]),
    ("env-passphrase", f"GPG_PASSPHRASE='{PASSWORDS[6]}'", PASSWORDS[6]),
    ("env-credentials", f"APP_CREDENTIALS={PASSWORDS[7]}", PASSWORDS[7]),
    ("env-api-key", f"STRIPE_API_KEY={PASSWORDS[8]}", PASSWORDS[8]),
    ("json-token", f'{{"token": "{PASSWORDS[9]}", "user": "bob"}}', PASSWORDS[9]),
    ("json-secret-key", f'{{"secret_key": "{PASSWORDS[10]}"}}', PASSWORDS[10]),
    ("json-passphrase", f'{{"passphrase": "{PASSWORDS[11]}"}}', PASSWORDS[11]),
    (
        "json-access-token",
        '{"access_token": "a1b2c3d4e5f6g7h8", "expires_in": 3600}',
        "a1b2c3d4e5f6g7h8",
    ),
    ("json-refresh-token", '{"refresh_token":"r9s8t7u6v5w4"}', "r9s8t7u6v5w4"),
    ("json-client-secret", '{"client_id": "shop", "client_secret": "zz-top-9911"}', "zz-top-9911"),
    ("json-escaped", '{"body": "{\\"password\\": \\"nested-pw-4411\\"}"}', "nested-pw-4411"),
    ("yaml-password", "database:\n  user: shop\n  password: yaml-pw-7731\n", "yaml-pw-7731"),
    ("yaml-api-key", "openai:\n  api_key: yaml-key-2209\n", "yaml-key-2209"),
    ("header-api-key", "X-Api-Key: hdr-key-55aa77", "hdr-key-55aa77"),
    ("kwargs-password", "connect(host='db', password='kw-pw-6610')", "kw-pw-6610"),
    (
        "query-password",
        "https://shop.example/login?user=bob&password=qs-pw-8812&next=/",
        "qs-pw-8812",
    ),
    ("sqlserver", "Server=db;Database=shop;User Id=sa;Password=ms-pw-3391;", "ms-pw-3391"),
]

INNOCENT: list[str] = [
    "order W000123 shipped to 221B Baker Street",
    "request id 3f1c2b9e-8a4d-4c1e-9b7a-2d5e6f7a8b9c took 120 ms",
    "commit 3f786850e387550fdab836ed7e6dc881de23001b fixes the aws upload retry",
    "git rev-parse HEAD printed 9fceb02d0ae598e95dc970b74767f19372d61af8",
    "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 matches",
    "token count: 1200 input, 80 output",
    "token usage was 1200 input tokens",
    "gen_ai.usage.input_tokens=1200 gen_ai.usage.output_tokens=80",
    '{"input_tokens": 12, "output_tokens": 3, "token_count": 15, "max_tokens": 256}',
    "max_tokens=4096, temperature=0.2",
    "TOKENIZERS_PARALLELISM=false",
    "the password policy requires 12 characters",
    "reset your password with the link we sent; passwords expire yearly",
    "ask the user for their secret handshake preferences",
    "the secret to good soup is patience",
    "private key rotation is scheduled monthly",
    "Bearer authentication is described in RFC 6750",
    '{"key": "user_id", "value": 42}',
    '{"sort_key": "created_at", "partition_key": "tenant"}',
    "see https://docs.example.com/api/keys for details",
    "the SKU list for Asia/Tokyo has 40 entries",
    "task-0123456789abcdefghijklmnop finished",
    "hf_hub_download(repo_id='gpt2', filename='config.json')",
    "The AWS region is us-east-1 and the bucket is shop-assets-2024",
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk",
    '{"password_policy": "strong", "password_min_length": 12}',
]
