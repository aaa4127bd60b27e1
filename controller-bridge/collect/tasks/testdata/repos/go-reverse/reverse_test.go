package reverse

import "testing"

func TestString(t *testing.T) {
	for in, want := range map[string]string{"": "", "abc": "cba", "héllo": "olléh", "日本語": "語本日"} {
		if got := String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}
