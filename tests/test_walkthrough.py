"""A new user's first ten minutes: a fresh project from `startproject`, the installed package
(tox and the dist env install the built wheel), one setting to guard every DRF view, then each
common mistake, made as a new user makes it, caught with a message saying what to do.

One scratch project serves every step (a mistake is a settings module or a URLconf of its own,
chosen by DJANGO_SETTINGS_MODULE), and gunicorn is started once, for the memory store's step."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("rest_framework")  # The base env (no DRF) leaves this walkthrough out.

# The scratch project keeps its records in a SQLite file of its own whatever the suite's database:
# the envs of the database servers would only repeat it (about 11 s), so it runs in SQLite's.
pytestmark = pytest.mark.sqlite

SETTINGS = """
INSTALLED_APPS += ["rest_framework", "rest_framework.authtoken", "django_idempotency", "shop"]
IDEMPOTENCY_GUARD_ALL_VIEWS = True
ALLOWED_HOSTS = ["testserver", "127.0.0.1"]  # What django.test.Client and gunicorn's caller send.
"""

# Each mistake: a settings module over the project's own (file name: contents).
MISTAKE_SETTINGS = {
    # Neither INSTALLED_APPS nor migrate: what a user who skimmed the README has.
    "settings_not_installed.py": """
from mysite.settings import *
INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django_idempotency"]
ROOT_URLCONF = "shop.urls_plain"
""",
    "settings_not_migrated.py": """
from mysite.settings import *
DATABASES = {"default": {**DATABASES["default"], "NAME": BASE_DIR / "never-migrated.sqlite3"}}
""",
    "settings_required.py": """
from mysite.settings import *
IDEMPOTENCY_GUARD_ALL_VIEWS = False
IDEMPOTENCY_REQUIRED = True
MIDDLEWARE += ["django_idempotency.middleware.IdempotencyMiddleware"]
ROOT_URLCONF = "shop.urls_logins"
""",
    "settings_check.py": """
from mysite.settings import *
IDEMPOTENCY_TTLL = 3600
IDEMPOTENCY_METHODS = ["POST", "PATHC"]
ROOT_URLCONF = "shop.urls_check"
""",
    "settings_viewset.py": """
from mysite.settings import *
ROOT_URLCONF = "shop.urls_viewset"
""",
    "settings_api_view.py": """
from mysite.settings import *
ROOT_URLCONF = "shop.urls_api_view"
""",
    "settings_memory.py": """
from mysite.settings import *
IDEMPOTENCY_STORE = "django_idempotency.stores.memory.MemoryStore"
IDEMPOTENCY_MODE = "lease"
""",
    "settings_forms.py": """
from mysite.settings import *
ROOT_URLCONF = "shop.urls_forms"
""",
}

VIEWS = """
from rest_framework.response import Response
from rest_framework.views import APIView

RUNS = {"orders": 0, "pings": 0}


class OrderView(APIView):
    authentication_classes = permission_classes = []

    def post(self, request):
        RUNS["orders"] += 1
        return Response({"order": RUNS["orders"]}, status=201)


class PingView(APIView):
    authentication_classes = permission_classes = []
    idempotency_exempt = True

    def post(self, request):
        RUNS["pings"] += 1
        return Response({"ping": RUNS["pings"]})
"""

URLS = """
from django.urls import path

from shop.views import OrderView, PingView

urlpatterns = [path("orders/", OrderView.as_view()), path("ping/", PingView.as_view())]
"""

# The project's own modules besides views.py (file name under shop/: contents).
SHOP = {
    "plain.py": """
from django.http import JsonResponse
from django_idempotency import idempotent


@idempotent
def create_order(request):
    return JsonResponse({"order": 1}, status=201)
""",
    "billing.py": """
from django_idempotency import idempotent_function


@idempotent_function(key="order_id")
def charge(order_id):
    return {"charged": order_id}
""",
    "urls_plain.py": """
from django.urls import path
from shop.plain import create_order

urlpatterns = [path("orders/", create_order)]
""",
    "tasks.py": """
from celery import Celery
from django_idempotency.contrib.celery import idempotent_task

app = Celery("shop", set_as_current=False)
app.conf.task_always_eager = True


@idempotent_task(app=app)
def send_receipt(order_id):
    return {"sent": order_id}
""",
    "urls_logins.py": """
from django.contrib import admin
from django.urls import path
from rest_framework.authtoken.views import obtain_auth_token

urlpatterns = [path("admin/", admin.site.urls), path("api-token-auth/", obtain_auth_token)]
""",
    "refunds.py": """
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from rest_framework.response import Response
from rest_framework.views import APIView


class RefundView(APIView, IdempotencyMixin):  # The mixin must come first.
    def post(self, request): ...


class VoidView(IdempotencyMixin, APIView):
    idempotency_requried = True  # Misspelt: "required".

    def post(self, request):
        return Response(status=201)
""",
    "urls_check.py": """
from django.urls import path
from shop.refunds import RefundView, VoidView

urlpatterns = [path("refunds/", RefundView.as_view()), path("voids/", VoidView.as_view())]
""",
    "urls_viewset.py": """
from rest_framework import viewsets
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from django_idempotency import idempotent


@idempotent
class OrderViewSet(viewsets.ViewSet):
    def create(self, request):
        return Response(status=201)


router = SimpleRouter()
router.register("orders", OrderViewSet, basename="order")
urlpatterns = router.urls
""",
    "urls_api_view.py": """
from django.urls import path
from rest_framework.decorators import api_view
from rest_framework.response import Response
from django_idempotency import idempotent


@idempotent
@api_view(["POST"])
def create_order(request):
    return Response(status=201)


urlpatterns = [path("orders/", create_order)]
""",
    "forms.py": """
from django.http import HttpResponse
from django.template import engines
from django_idempotency import idempotent

PAGE = engines["django"].from_string(
    '<form method="post">{% csrf_token %}<input name="amount"></form>'
)
RUNS = []


@idempotent
def pay(request):
    if request.method == "GET":
        return HttpResponse(PAGE.render({}, request))
    RUNS.append(request.POST["amount"])
    return HttpResponse(f"paid {len(RUNS)}", status=201)
""",
    "urls_forms.py": """
from django.urls import path
from shop.forms import pay

urlpatterns = [path("pay/", pay)]
""",
}

DRIVE = """
import json
from django.test import Client
from shop.views import RUNS

client = Client()
def post(url):
    return client.post(url, {"item": "book"}, content_type="application/json",
                       headers={"Idempotency-Key": "order-1"})

first, retry = post("/orders/"), post("/orders/")
pings = [post("/ping/"), post("/ping/")]
print(json.dumps({
    "statuses": [first.status_code, retry.status_code],
    "replayed": retry.headers.get("Idempotent-Replayed"),
    "same_body": first.content == retry.content,
    "runs": RUNS,
    "ping_replayed": [p.headers.get("Idempotent-Replayed") for p in pings],
}))
"""

MISTAKES = """
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from rest_framework.views import APIView


class RefundView(APIView, IdempotencyMixin):  # The mixin must come first.
    def post(self, request): ...
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scratch project for every step: `startproject`, an app, one setting, `migrate`."""
    root = tmp_path_factory.mktemp("walkthrough")
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(root)], check=True
    )
    shop = root / "shop"
    shop.mkdir()
    (shop / "__init__.py").write_text("")
    (shop / "views.py").write_text(VIEWS)
    for name, text in SHOP.items():
        (shop / name).write_text(text)
    settings = root / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + SETTINGS)
    for name, text in MISTAKE_SETTINGS.items():
        (root / "mysite" / name).write_text(text)
    (root / "mysite" / "urls.py").write_text(URLS)
    migrated = manage(root, "migrate", "--verbosity", "0")
    assert migrated.returncode == 0, migrated.stderr
    return root


def user_environment(settings: str) -> dict[str, str]:
    """What a user's shell gives manage.py: PATH, and PYTHONPATH when the suite runs with one
    (a checkout's copy of the package, rather than the one installed)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "DJANGO_SETTINGS_MODULE": f"mysite.{settings}",
    }
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def manage(
    project: Path, *args: str, settings: str = "settings"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env=user_environment(settings),
        timeout=120,
    )


def shell(project: Path, code: str, *, settings: str) -> dict[str, Any]:
    """Run `code` in `manage.py shell`; it prints one JSON line last, which is returned."""
    result = manage(project, "shell", "--command", code, settings=settings)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


NOT_INSTALLED = (
    'django_idempotency is not in INSTALLED_APPS: add "django_idempotency" to INSTALLED_APPS,'
    " then run `python manage.py migrate django_idempotency`."
)


def test_one_setting_guards_every_drf_view_and_an_exempt_view_is_left_alone(project: Path) -> None:
    result = manage(project, "shell", "--command", DRIVE)

    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["statuses"] == [201, 201]
    assert outcome["replayed"] == "true"
    assert outcome["same_body"] is True
    assert outcome["runs"] == {"orders": 1, "pings": 2}  # The exempt view ran both times.
    assert outcome["ping_replayed"] == [None, None]


def test_check_reports_the_mistakes_it_can_see_each_with_its_fix(project: Path) -> None:
    result = manage(project, "check", settings="settings_check")

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    # The mixin after APIView, a misspelt setting, a method name that is none, a misspelt
    # view attribute: each named, with what to write instead.
    assert "django_idempotency.E013" in result.stderr
    assert "shop.refunds.RefundView" in result.stderr
    assert (
        "IDEMPOTENCY_TTLL is not a django-idempotency setting; did you mean IDEMPOTENCY_TTL?"
        in result.stderr
    )
    assert "(django_idempotency.E022)" in result.stderr
    assert "'PATHC'" in result.stderr
    assert "(django_idempotency.W008)" in result.stderr
    assert "idempotency_requried" in result.stderr
    assert "idempotency_required" in result.stderr


# A mistake made in code, met as the URLconf is imported (by `check`, by runserver's checks, or by
# the first request): said in its sentence with the fix, never under a traceback, nor as an error
# of Django or DRF about something the user did not write.
TRACEBACK = "Traceback (most recent call last)"


def runserver(project: Path, *, settings: str) -> subprocess.CompletedProcess[str]:
    """`runserver --noreload`, for a project its checks stop: it exits before it serves."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return manage(project, "runserver", "--noreload", f"127.0.0.1:{port}", settings=settings)


def test_a_forgotten_installed_apps_entry_is_named_by_view_function_and_task(
    project: Path,
) -> None:
    checked = manage(project, "check", settings="settings_not_installed")
    calls = shell(
        project,
        "import json\n"
        "from shop.billing import charge\n"
        "from shop.tasks import send_receipt\n"
        "answers = {}\n"
        "for name, call in (('function', lambda: charge('o-1')),\n"
        "                   ('task', lambda: send_receipt.delay('o-1').get())):\n"
        "    try:\n"
        "        answers[name] = call()\n"
        "    except Exception as exc:\n"
        "        answers[name] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(answers))",
        settings="settings_not_installed",
    )

    served = runserver(project, settings="settings_not_installed")

    # The app's checks are not registered without it: manage.py prints the decorator's error as
    # a command's, one line.
    assert checked.returncode == 1
    assert TRACEBACK not in checked.stderr
    assert checked.stderr.strip() == f"AppNotInstalled: {NOT_INSTALLED}"
    assert served.returncode == 1
    assert TRACEBACK not in served.stderr
    assert served.stderr.strip().splitlines()[-1] == f"AppNotInstalled: {NOT_INSTALLED}"
    assert calls == {
        "function": f"AppNotInstalled: {NOT_INSTALLED}",
        "task": f"AppNotInstalled: {NOT_INSTALLED}",
    }


def test_a_forgotten_migrate_is_a_warning_of_check_and_a_500_problem_not_a_traceback(
    project: Path,
) -> None:
    checked = manage(project, "check", "--database", "default", settings="settings_not_migrated")
    answer = shell(
        project,
        "import json\n"
        "from django.test import Client\n"
        "r = Client().post('/orders/', {}, content_type='application/json',\n"
        "                  headers={'Idempotency-Key': 'o-1'})\n"
        "print(json.dumps({'status': r.status_code, 'type': r['Content-Type'],\n"
        "                  'body': r.json(), 'retry_after': r.get('Retry-After')}))",
        settings="settings_not_migrated",
    )

    assert checked.returncode == 0, checked.stderr
    assert "(django_idempotency.W006)" in checked.stderr
    assert "run `python manage.py migrate django_idempotency`" in checked.stderr
    assert answer["status"] == 500
    assert answer["type"] == "application/problem+json"
    assert answer["body"]["type"].endswith("store-misconfigured")
    assert answer["retry_after"] is None
    assert "Traceback" not in json.dumps(answer)


def test_a_required_key_leaves_the_admin_login_and_obtain_auth_token_alone(
    project: Path,
) -> None:
    answers = shell(
        project,
        "import json\n"
        "from django.test import Client\n"
        "client = Client()\n"
        "login = client.post('/admin/login/', {'username': 'u', 'password': 'p'})\n"
        "token = client.post('/api-token-auth/', {'username': 'u', 'password': 'p'})\n"
        "print(json.dumps({'login': [login.status_code, login['Content-Type']],\n"
        "                  'token': [token.status_code, token.json()]}))",
        settings="settings_required",
    )

    # Answered by the views themselves (the form again; DRF's wrong credentials), not by a
    # 400 missing-key no browser or login form could ever satisfy.
    assert answers["login"] == [200, "text/html; charset=utf-8"]
    assert answers["token"][0] == 400
    assert "non_field_errors" in answers["token"][1]


@pytest.mark.parametrize(
    ("settings", "says", "fix"),
    [
        (
            "settings_viewset",
            "@idempotent was applied to the class shop.urls_viewset.OrderViewSet (routed at",
            "HINT: Put it on the handler methods or actions instead",
        ),
        (
            "settings_api_view",
            "@idempotent was applied to shop.urls_api_view.create_order, a view built by"
            " as_view() or @api_view (routed at 'orders/')",
            "HINT: Place it below @api_view, or on the handler method.",
        ),
    ],
    ids=["on a viewset class", "above api_view"],
)
def test_a_misplaced_decorator_is_a_check_error_with_where_it_goes_and_a_500_problem(
    project: Path, settings: str, says: str, fix: str
) -> None:
    checked = manage(project, "check", settings=settings)
    served = runserver(project, settings=settings)
    requested = manage(
        project,
        "shell",
        "--command",
        "import json\n"
        "from django.test import Client\n"
        "r = Client().post('/orders/', {}, content_type='application/json',\n"
        "                  headers={'Idempotency-Key': 'o-1'})\n"
        "print(json.dumps({'status': r.status_code, 'type': r['Content-Type'],\n"
        "                  'body': r.json()}))",
        settings=settings,
    )

    assert checked.returncode == 1
    assert TRACEBACK not in checked.stderr
    assert "(django_idempotency.E024) " + says in checked.stderr
    assert fix in checked.stderr
    assert "W008" not in checked.stderr  # What the decorator marks is no misspelt attribute.
    # runserver refuses to start, as for any check's error.
    assert served.returncode == 1
    assert TRACEBACK not in served.stderr
    assert served.stderr.startswith("SystemCheckError: System check identified some issues:")
    assert "(django_idempotency.E024) " + says in served.stderr
    # Started without the checks (a WSGI server, the test client), it runs nothing unguarded.
    assert requested.returncode == 0, requested.stderr
    answer = json.loads(requested.stdout.strip().splitlines()[-1])
    assert answer["status"] == 500
    assert answer["type"] == "application/problem+json"
    assert answer["body"]["type"].endswith("view-misconfigured")
    assert TRACEBACK not in requested.stderr
    assert "Idempotent view misconfigured: " + says.split(" (routed at")[0] in requested.stderr


def test_a_csrf_form_rendered_again_and_retried_replays(project: Path) -> None:
    answers = shell(
        project,
        "import json, re\n"
        "from django.test import Client\n"
        "from shop.forms import RUNS\n"
        "client = Client(enforce_csrf_checks=True)\n"
        "def submit():\n"
        "    page = client.get('/pay/').content.decode()\n"
        '    token = re.search(\'name="csrfmiddlewaretoken" value="([^"]+)\', page)[1]\n'
        "    return client.post('/pay/', {'csrfmiddlewaretoken': token, 'amount': '5'},\n"
        "                       headers={'Idempotency-Key': 'pay-1'}), token\n"
        "(first, one), (retry, other) = submit(), submit()\n"
        "print(json.dumps({'statuses': [first.status_code, retry.status_code],\n"
        "                  'replayed': retry.get('Idempotent-Replayed'),\n"
        "                  'new_token': one != other, 'runs': len(RUNS)}))",
        settings="settings_forms",
    )

    assert answers == {
        "statuses": [201, 201],
        "replayed": "true",
        "new_token": True,
        "runs": 1,
    }


@pytest.fixture(scope="module")
def gunicorn_two_workers(project: Path) -> Iterator[tuple[str, Path]]:
    """gunicorn --workers 2 (no --preload: each worker creates its own memory store), once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = project / "gunicorn.log"
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "--workers", "2", "--bind", f"127.0.0.1:{port}"),
            *("--error-logfile", str(log), "--capture-output", "mysite.wsgi"),
        ],
        cwd=project,
        env=user_environment("settings_memory"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "gunicorn did not start within 30 s"
                time.sleep(0.1)
        yield url, log
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def test_the_memory_store_under_two_gunicorn_workers_is_refused_with_a_500_problem(
    gunicorn_two_workers: tuple[str, Path],
) -> None:
    url, log = gunicorn_two_workers
    request = urllib.request.Request(
        f"{url}/orders/",
        data=b'{"item": "book"}',
        headers={"Content-Type": "application/json", "Idempotency-Key": "order-1"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=30)

    assert answer.value.code == 500
    assert answer.value.headers["Content-Type"] == "application/problem+json"
    assert answer.value.headers["Retry-After"] is None
    body = json.loads(answer.value.read())
    assert body["type"].endswith("store-misconfigured")
    assert "Traceback" not in json.dumps(body)
    # The operator's half: the server's log says what to change.
    logged = log.read_text()
    assert "this server runs several worker processes" in logged
    assert "Use the database store (the default)" in logged
