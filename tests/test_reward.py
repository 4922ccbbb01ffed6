"""Answer extraction, correctness and the reward on GSM8K-style answers."""

import pytest

from reward import extract_answer, is_correct, normalize_number, reward_fn

EXTRACTION = [
    # (completion, expected normalised answer or None)
    ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
    ("#### 72", "72"),
    ("####72", "72"),
    ("The answer is\n#### -5", "-5"),
    ("He loses 12 dollars.\n#### -12.", "-12"),
    ("#### 3.50", "3.5"),
    ("#### 0.25", "0.25"),
    ("#### .5", "0.5"),
    ("#### 1,000", "1000"),
    ("#### 1,000.00", "1000"),
    ("#### $1,234,567", "1234567"),
    ("#### $ 18", "18"),
    ("It costs $18.\n#### $18.00", "18"),
    ("#### 10.", "10"),
    ("#### -0", "0"),
    ("#### 007", "7"),
    ("first 5 then 6\n#### 6\nthen later #### 9", "9"),            # last #### wins
    ("#### 4\n#### nothing here", "4"),                             # last parseable ####
    ("no final marker, but 3 apples and 5 pears, so 8", "8"),      # last number
    ("The total is 1,250 dollars.", "1250"),
    ("Costs are 2.5, 3.5 and 4.75.", "4.75"),
    ("1,2,3", "3"),                                                 # not a thousands number
    ("I owe -3 dollars", "-3"),
    ("The temperature is -2.50 degrees.", "-2.5"),
    ("In 2024 she was 30.", "30"),
    ("I don't know.", None),
    ("", None),
    ("####", None),
    ("#### x", None),
    ("answer: forty-two", None),
    ("10 - 4 = 6", "6"),
    ("5 * 3 = 15 so the answer is 15.\n\n", "15"),
    ("#### 1000000000000", "1000000000000"),
    ("the result is 12.000", "12"),
    ("Total: $0.99", "0.99"),
    ("#### 42 apples", "42"),
    # What the '####' line must hold: one number or one fraction, nothing computed after it.
    ("#### 3/4", "0.75"),                                            # a fraction is its value
    ("#### 8/2", "4"),
    ("#### 2 / 6", "1/3"),                                           # no finite decimal: a fraction
    ("#### 1/0", None),
    ("#### 12+5=17", None),                                          # an expression is unparsed
    ("#### 12 + 5", None),
    ("#### 5 - 3", None),
    ("#### 6 * 7", None),
    ("Then 5 + 7 = 12.\n#### 12+5=17", None),                        # no fallback to other numbers
    ("#### 18 dollars and 50 cents", None),                          # two numbers
    ("#### 50%", "50"),
    ("#### 18 dollars.", "18"),
    ("#### -5.", "-5"),
    ("#### 12\n#### 3+4", "12"),                                     # the last #### that parses
]


@pytest.mark.parametrize("text,expected", EXTRACTION)
def test_extract_answer(text, expected):
    assert extract_answer(text, "gsm8k") == expected


def test_table_is_large_enough():
    assert len(EXTRACTION) >= 30


def test_normalize_number_equates_spellings():
    assert normalize_number("1,000.00") == normalize_number("1000") == "1000"
    assert normalize_number("-3.50") == "-3.5"
    assert normalize_number("9" * 200) is None  # longer than any answer: refused, not parsed


def test_reward_and_truncation_penalty():
    assert reward_fn("so #### 18", "18") == 1.0
    assert reward_fn("so #### 17", "18") == 0.0
    assert reward_fn("nothing", "18") == 0.0
    assert reward_fn("so #### 18", "18", truncated=True, truncation_penalty=0.5) == 0.5
    assert reward_fn("so #### 17", "18", truncated=True, truncation_penalty=0.5) == -0.5
    assert not is_correct(None, "18")


def test_reward_never_evaluates_text():
    assert reward_fn("#### __import__('os').system('echo hacked')", "0") == 0.0
    assert extract_answer("#### 2**1000000") is None   # an expression: unparsed, never computed


