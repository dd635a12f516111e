"""`hwrun.training`'s boolean check lives below both its users (issue 38: options imported lora at the top while lora
imported options.check_booleans inside a function, an import circle). That no circle is left anywhere in hwrun,
counting imports inside functions, is test_hwrun_engine_rooms.py's circle test over all of hwrun."""

from __future__ import annotations


def test_options_and_lora_share_the_boolean_check_from_a_lower_module():
    from hwrun.training import booleans, lora, options

    assert options.check_booleans is booleans.check_booleans
    assert lora.check_booleans is booleans.check_booleans
