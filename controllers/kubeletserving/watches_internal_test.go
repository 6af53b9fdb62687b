package kubeletserving

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFairShare(t *testing.T) {
	for name, tc := range map[string]struct {
		wants       []int
		total, want int
		share       int
	}{
		"alone, within the bound":         {wants: []int{10}, total: 1000, want: 10, share: 10},
		"alone, beyond the bound":         {wants: []int{5000}, total: 1000, want: 5000, share: 1000},
		"two greedy split it":             {wants: []int{5000, 5000}, total: 1000, want: 5000, share: 500},
		"a small claim is met whole":      {wants: []int{5000, 100}, total: 1000, want: 100, share: 100},
		"and leaves the rest":             {wants: []int{5000, 100}, total: 1000, want: 5000, share: 900},
		"three, one small":                {wants: []int{10, 600, 800}, total: 1000, want: 600, share: 495},
		"nothing wanted":                  {wants: nil, total: 1000, want: 0, share: 0},
		"equal claims at the equal split": {wants: []int{500, 500}, total: 1000, want: 500, share: 500},
	} {
		t.Run(name, func(t *testing.T) {
			assert.Equal(t, tc.share, fairShare(tc.wants, tc.total, tc.want))
		})
	}
}
