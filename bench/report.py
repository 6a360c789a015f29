"""The benchmarks' one way to print a result: a titled Markdown table (pasteable into the README)."""


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}\n")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for row in rows:
        print(" | ".join(row))
