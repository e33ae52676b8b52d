"""ORM steps of the psycopg scenario: bulk inserts whose generated keys come back through
`INSERT … RETURNING`, 1000 rows at a time (more than the default 200-row cap).

Each function takes the token's DSN, raises on any mismatch and returns a detail line.
"""

from urllib.parse import unquote, urlsplit

N = 1000


def _parts(dsn):
    u = urlsplit(dsn)
    return {
        "user": unquote(u.username or ""),
        "password": unquote(u.password or ""),
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 5432,
        "dbname": (u.path or "/sandpit").lstrip("/") or "sandpit",
    }


def django_bulk_create(dsn):
    """Django configured in-process (no project), one model, `bulk_create` of N objects."""
    import django
    from django.conf import settings

    p = _parts(dsn)
    if not settings.configured:
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": p["dbname"],
                    "USER": p["user"],
                    "PASSWORD": p["password"],
                    "HOST": p["host"],
                    "PORT": str(p["port"]),
                }
            },
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        django.setup()
    from django.db import connection, models

    class Widget(models.Model):
        name = models.TextField()

        class Meta:
            app_label = "scenario"
            db_table = "django_widget"

    with connection.schema_editor() as editor:
        editor.create_model(Widget)
    try:
        try:
            made = Widget.objects.bulk_create([Widget(name=f"w{i}") for i in range(N)])
        except AssertionError as e:
            # Django asserts that INSERT … RETURNING gave one row per object.
            raise AssertionError(f"bulk_create's own check failed (fewer keys than objects) {e}") from e
        keys = [w.pk for w in made]
        if len(keys) != N or any(k is None for k in keys) or len(set(keys)) != N:
            missing = sum(k is None for k in keys)
            raise AssertionError(f"bulk_create returned {len(keys)} objects, {missing} without a key")
        if Widget.objects.count() != N:
            raise AssertionError(f"{Widget.objects.count()} rows stored, want {N}")
        # The stored keys, read back in pages below the cap, are exactly the returned ones.
        stored = set()
        last = 0
        while True:
            page = list(Widget.objects.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[:150])
            if not page:
                break
            stored.update(page)
            last = page[-1]
        if stored != set(keys):
            raise AssertionError("the keys bulk_create returned are not the stored ones")
    finally:
        connection.close()
    return f"Django {django.__version__}: {N} objects, {N} keys"


def sqlalchemy_flush(dsn):
    """SQLAlchemy 2 ORM over psycopg 3: `add_all` of N objects, `flush()`, keys assigned."""
    import sqlalchemy
    from sqlalchemy import String, create_engine, func, select
    from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

    p = _parts(dsn)
    url = sqlalchemy.URL.create(
        "postgresql+psycopg",
        username=p["user"],
        password=p["password"],
        host=p["host"],
        port=p["port"],
        database=p["dbname"],
    )

    class Base(DeclarativeBase):
        pass

    class Gadget(Base):
        __tablename__ = "sqlalchemy_gadget"
        id: Mapped[int] = mapped_column(primary_key=True)
        name: Mapped[str] = mapped_column(String(40))

    engine = create_engine(url)
    try:
        Base.metadata.create_all(engine)
        with Session(engine) as s:
            objs = [Gadget(name=f"g{i}") for i in range(N)]
            s.add_all(objs)
            s.flush()
            keys = [o.id for o in objs]
            if any(k is None for k in keys) or len(set(keys)) != N:
                raise AssertionError(f"flush assigned {len(set(k for k in keys if k is not None))} keys, want {N}")
            s.commit()
        with Session(engine) as s:
            n = s.scalar(select(func.count()).select_from(Gadget))
            if n != N:
                raise AssertionError(f"{n} rows stored, want {N}")
            # insert().returning() as Core sees it: every id, not the first 200.
            ids = s.scalars(
                sqlalchemy.insert(Gadget).returning(Gadget.id),
                [{"name": f"r{i}"} for i in range(N)],
            ).all()
            if len(ids) != N:
                raise AssertionError(f"insert().returning() gave {len(ids)} ids, want {N}")
            s.commit()
    finally:
        engine.dispose()
    return f"SQLAlchemy {sqlalchemy.__version__}: add_all + flush of {N}, insert().returning() of {N}"
